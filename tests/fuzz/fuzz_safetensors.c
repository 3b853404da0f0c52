/* Fuzzes the safetensors header parser: any bytes must give SHOAL_OK with
 * every range inside the data, or an error with a message; never a crash. */
#include "common/common_assert.h"
#include "worker/worker_safetensors.h"

#include <stddef.h>
#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    worker_safetensors st;
    shoal_diag diag = {{0}};
    shoal_err err = worker_safetensors_parse(data, size, "fuzz", &st, &diag);
    if (err == SHOAL_OK) {
        for (int i = 0; i < st.tensors; i++) {
            const worker_tensor_info *t = &st.info[i];
            SHOAL_ASSERT(t->begin <= t->end && t->end <= st.data_bytes);
            SHOAL_ASSERT(worker_safetensors_find(&st, t->name) == t);
            /* Touch the first and last byte: ASan sees any range outside. */
            if (t->end > t->begin) {
                volatile unsigned char a = st.data[t->begin], b = st.data[t->end - 1];
                (void)a;
                (void)b;
            }
        }
        worker_safetensors_close(&st);
    } else {
        SHOAL_ASSERT(diag.msg[0] != '\0');
    }
    return 0;
}
