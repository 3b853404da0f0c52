/* Fuzzes the safetensors header parser: any bytes must give SHOAL_OK with
 * every range inside the data, or an error with a message; never a crash. */
#include "common/common_assert.h"
#include "model/model_safetensors.h"

#include <stddef.h>
#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    model_safetensors st;
    shoal_diag diag = {{0}};
    shoal_err err = model_safetensors_parse(data, size, "fuzz", &st, &diag);
    if (err == SHOAL_OK) {
        for (int i = 0; i < st.tensors; i++) {
            const model_tensor_info *t = &st.info[i];
            SHOAL_ASSERT(t->begin <= t->end && t->end <= st.data_bytes);
            SHOAL_ASSERT(model_safetensors_find(&st, t->name) == t);
            /* Touch the first and last byte: ASan sees any range outside. */
            if (t->end > t->begin) {
                volatile unsigned char a = st.data[t->begin], b = st.data[t->end - 1];
                (void)a;
                (void)b;
            }
        }
        model_safetensors_close(&st);
    } else {
        SHOAL_ASSERT(diag.msg[0] != '\0');
    }
    return 0;
}
