#include "worker_model.h"

#include "common/common_assert.h"
#include "common/common_limits.h"
#include "common/common_log.h"
#include "model/model_arch.h"
#include "model/model_cache.h"
#include "worker/worker_fingerprint.h"
#include "model/model_weights.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* A weight matrix on the backend (kernels_weight.h). */
typedef kernels_weight model_matrix;

/* A layer's blocks: attention or a gated DeltaNet, then a dense MLP
 * (gate, up, down) or a mixture of experts (router, and each expert's
 * gate, up and down stacked in one array of the layer, and a shared
 * expert where the architecture has one), as mixer_kind and mlp_kind say. */
typedef struct model_layer {
    model_matrix q, k, v, o, gate, up, down;
    /* gated attention (attn_output_gate): q_proj's gate rows */
    model_matrix q_gate;
    bool moe, shared;
    model_matrix router, experts_gate, experts_up, experts_down;
    model_matrix shared_gate, shared_up, shared_down, shared_expert_gate;
    /* a gated DeltaNet layer (no q, k, v, o): its projections in Qwen3.5's
     * layout (Qwen3-Next's regrouped at load), conv weights F32
     * [conv_dim][lin_conv], -exp(A_log) and dt_bias F32 [v_heads], the
     * gated norm's weight F32 [v_dim]; state_layer: its index among the
     * STATE layers (its state's place in a slot) */
    bool linear;
    model_matrix lin_qkv, lin_z, lin_b, lin_a, lin_out;
    float *lin_conv, *lin_decay, *lin_dt_bias, *lin_norm;
    int state_layer;
    /* q, k and v sit back to back in one allocation, as do gate and up:
     * a one-row pass (decode at batch 1) takes each group as one matmul,
     * whose output row is the three (two) outputs back to back. */
    bool qkv_joined, gate_up_joined;
    bool lin_joined; /* lin_qkv, lin_b and lin_a back to back: one matmul */
    float *attn_norm, *mlp_norm; /* (device) F32 [hidden] */
    float *q_norm, *k_norm;      /* (device) F32 [head_dim], Qwen3 only */
} model_layer;

struct worker_model {
    worker_model_options opt;
    model_config cfg;
    kernels_backend *be;
    model_weights *weights;

    model_matrix embed, lm_head;
    float *final_norm;
    /* The layers' RMSNorm weights folded into their q/k/v and gate/up
     * weights (fold_norms): passes of at most be->fused_norm_rows rows
     * take each norm inside the matmul after it, and the residual add
     * inside the matmul before it. */
    bool norm_fused;
    float *inv_freq;
    model_layer *layers;

    /* Device allocations to free at close (weights uploaded, norms, buffers). */
    void **owned;
    int owned_count, owned_cap;

    model_cache_spec cache; /* the pages hold its attention group's layers */
    kernels_kv_layout kv;
    /* The KV page arena: shared memory of the backend (arena_create), so
     * other workers can map it through arena_fd. */
    void *arena;
    size_t arena_bytes; /* as mapped: kv_pages x page_bytes, rounded up */
    int arena_fd;       /* -1 until made */

    /* activations (device), sized for opt.max_rows rows */
    void *x, *h, *q, *k, *v, *att, *pend, *gate, *up, *sel;
    /* mixture of experts (device): router logits F32 [rows][experts], the
     * routing of every layer's rows (ids I32, weights F32 [layers][rows]
     * [experts_per_tok], kept a pass for worker_model_routing) and the
     * experts' scratch */
    float *router_logits, *route_weights;
    int32_t *route_ids;
    void *moe_scratch;
    /* hybrids: the recurrent states, state_slots slots of slot_bytes
     * (model_cache.h); the DeltaNet block's scratch; the attention gate
     * [rows][heads * head_dim]; the shared expert's output and gate logit */
    void *states;
    size_t slot_bytes;
    void *lin_scratch, *att_gate, *shared_out, *shared_logit;
    int32_t *slots; /* (device) this pass's slot of each stream */
    float *logits;
    /* A step's inputs go up in one upload: the host builds them in `stage`
     * and copies them to `dstage` (device) laid out by step_layout_of().
     * The pointers below point into dstage, where this step's layout puts
     * them. */
    unsigned char *stage, *dstage;
    size_t stage_bytes;
    int32_t *ids, *positions, *row_stream, *page_table, *logit_rows;
    kernels_sample_params *params;
    /* sampling (device): results per logit row, penalty lists */
    kernels_sample_result *results;
    int32_t *pen_offsets, *pen_tokens, *pen_counts;
    int pen_cap;
    /* Attention of a pass, by row ranges (host): runs of one stream of at
     * least WORKER_ATTN_PROMPT_ROWS rows (prompt chunks) take the prompt
     * kernel, the rest the partials; seg_single: every stream of the
     * segment has one row (kernels_batch.one_row_per_stream). [max_rows]
     * each. */
    int32_t *seg_row0, *seg_rows;
    bool *seg_prompt, *seg_single;
    int segs;
    /* Decode rounds (every row sampled, no prompt run) are recorded once
     * per (kind, rows) and replayed: graph_ready[slot]. */
    bool *graph_ready;
    int graph_rows; /* rows a recorded round may have: 0 = no graphs */
    common_hash fingerprint;
};

typedef enum run_kind { RUN_FORWARD = 0, RUN_STEP, RUN_STEP_PENALTIES, RUN_KINDS } run_kind;

/* Byte offsets of a step's inputs in the staging buffers. They depend on
 * the row, logit row and page table sizes alone, so a recorded round
 * finds its inputs where it was recorded. */
typedef struct step_layout {
    size_t ids, positions, row_stream, logit_rows, params, page_table, slots, bytes;
} step_layout;

static size_t align16(size_t x)
{
    return (x + 15) & ~(size_t)15;
}

static step_layout step_layout_of(int rows, int logit_count, int streams, int stride)
{
    step_layout s;
    size_t at = 0, r = (size_t)rows * 4;
    s.ids = at, at += r;
    s.positions = at, at += r;
    s.row_stream = at, at += r;
    s.logit_rows = at, at += (size_t)logit_count * 4;
    s.params = at = align16(at), at += (size_t)logit_count * sizeof(kernels_sample_params);
    s.page_table = at = align16(at), at += (size_t)streams * (size_t)stride * 4;
    s.slots = at, at += (size_t)streams * 4;
    s.bytes = at;
    return s;
}

void worker_model_options_default(worker_model_options *opt)
{
    memset(opt, 0, sizeof *opt);
    opt->device = "cpu";
    opt->page_tokens = 16;
    opt->kv_pages = 256;
    opt->max_rows = 2048;
    opt->max_logit_rows = 64;
    opt->max_streams = 64;
    opt->max_pages_per_stream = 2048;
    opt->dummy_seed = 0x5110a1ull;
    opt->kv_dtype = SHOAL_DTYPE_BF16;
}

static void *dev_alloc(worker_model *m, size_t bytes)
{
    if (m->owned_count == m->owned_cap) {
        int cap = m->owned_cap ? m->owned_cap * 2 : 64;
        void **p = realloc(m->owned, (size_t)cap * sizeof *p);
        if (!p)
            return NULL;
        m->owned = p;
        m->owned_cap = cap;
    }
    void *ptr = m->be->alloc(m->be, bytes);
    if (ptr)
        m->owned[m->owned_count++] = ptr;
    return ptr;
}

/* Device copy of host bytes (or the host bytes themselves on a backend
 * that reads host memory and when in_place allows it). */
static shoal_err dev_place(worker_model *m, const void *src, size_t bytes, bool in_place,
                           const void **out)
{
    if (in_place && m->be->host_memory) {
        *out = src;
        return SHOAL_OK;
    }
    void *dst = dev_alloc(m, bytes);
    if (!dst)
        return SHOAL_ERR_NOMEM;
    *out = dst;
    return m->be->upload(m->be, dst, src, bytes);
}

static shoal_err load_matrix(worker_model *m, const char *name, int64_t rows, int64_t cols,
                             model_matrix *out, shoal_diag *diag)
{
    if (model_weights_is_dummy(m->weights) && m->be->fill_random) {
        /* made on the device: no host copy, no upload (an 8B model in
         * seconds, not minutes) */
        uint64_t state;
        float base, scale;
        model_weights_dummy_recipe(m->weights, name, 2, &state, &base, &scale);
        size_t n = (size_t)rows * (size_t)cols;
        void *dst = dev_alloc(m, n * 2);
        if (!dst)
            return shoal_diag_set(diag, SHOAL_ERR_NOMEM,
                                  "tensor '%s': cannot place %zu bytes on the device", name, n * 2);
        m->be->fill_random(m->be, dst, n, state, base, scale);
        *out = (model_matrix){
            .data = dst, .dtype = SHOAL_DTYPE_BF16, .rows = rows, .cols = cols, .experts = 1};
        return SHOAL_OK;
    }
    int64_t shape[2] = {rows, cols};
    model_tensor_ref t;
    shoal_err err = model_weights_get(m->weights, name, 2, shape, &t, diag);
    if (err)
        return err;
    *out = (model_matrix){.dtype = t.dtype, .rows = rows, .cols = cols, .experts = 1};
    err = dev_place(m, t.data, (size_t)t.bytes, true, &out->data);
    if (err)
        return shoal_diag_set(diag, err, "tensor '%s': cannot place %llu bytes on the device", name,
                              (unsigned long long)t.bytes);
    return SHOAL_OK;
}

/* Places the matrices `names` (rows[i] x cols each) back to back in one
 * device allocation, when the backend keeps its own copy and they share a
 * dtype: *joined says whether it did; else each is placed alone. */
static shoal_err load_joined(worker_model *m, const char *const *names, const int64_t *rows, int n,
                             int64_t cols, model_matrix *const *out, bool *joined, shoal_diag *diag)
{
    enum { JOIN_MAX = 3 };
    SHOAL_ASSERT(n <= JOIN_MAX);
    shoal_err err;
    bool dummy = model_weights_is_dummy(m->weights) && m->be->fill_random;
    model_tensor_ref t[JOIN_MAX];
    size_t total = 0;
    *joined = !m->be->host_memory;
    for (int i = 0; i < n && *joined; i++) {
        if (dummy) {
            total += (size_t)rows[i] * (size_t)cols * 2;
            continue;
        }
        int64_t shape[2] = {rows[i], cols};
        if ((err = model_weights_get(m->weights, names[i], 2, shape, &t[i], diag)))
            return err;
        *joined = t[i].dtype == t[0].dtype;
        total += (size_t)t[i].bytes;
    }
    if (!*joined) {
        for (int i = 0; i < n; i++)
            if ((err = load_matrix(m, names[i], rows[i], cols, out[i], diag)))
                return err;
        return SHOAL_OK;
    }
    unsigned char *dst = dev_alloc(m, total);
    if (!dst)
        return shoal_diag_set(diag, SHOAL_ERR_NOMEM,
                              "tensor '%s' and the next: cannot place %zu bytes on the device",
                              names[0], total);
    for (int i = 0; i < n; i++) {
        *out[i] = (model_matrix){.data = dst, .rows = rows[i], .cols = cols, .experts = 1};
        if (dummy) {
            uint64_t state;
            float base, scale;
            size_t elems = (size_t)rows[i] * (size_t)cols;
            model_weights_dummy_recipe(m->weights, names[i], 2, &state, &base, &scale);
            m->be->fill_random(m->be, dst, elems, state, base, scale);
            out[i]->dtype = SHOAL_DTYPE_BF16;
            dst += elems * 2;
        } else {
            out[i]->dtype = t[i].dtype;
            if ((err = m->be->upload(m->be, dst, t[i].data, (size_t)t[i].bytes)))
                return shoal_diag_set(diag, err, "tensor '%s': cannot upload it", names[i]);
            dst += t[i].bytes;
        }
    }
    return SHOAL_OK;
}


/* The architecture's name of `role` in layer l (expert e) into buf. */
static const char *role_name(const worker_model *m, model_role role, int l, int e, char *buf)
{
    bool has = model_tensor_name_of(&m->cfg, role, l, e, buf, SHOAL_TENSOR_NAME_BYTES_MAX);
    SHOAL_ASSERT(has); /* the blocks ask only for roles their architecture has */
    return buf;
}

static shoal_err load_role_matrix(worker_model *m, model_role role, int l, model_matrix *out,
                                  shoal_diag *diag)
{
    char name[SHOAL_TENSOR_NAME_BYTES_MAX];
    int dims;
    int64_t shape[3];
    model_tensor_shape(&m->cfg, role, &dims, shape);
    return load_matrix(m, role_name(m, role, l, 0, name), shape[0], shape[1], out, diag);
}


/* Matrices of `roles` (each of layer l) back to back where the backend
 * keeps its own copy and they share a dtype (load_joined). */
static shoal_err load_role_joined(worker_model *m, const model_role *roles, int n, int l,
                                  model_matrix *const *out, bool *joined, shoal_diag *diag)
{
    enum { JOIN_MAX = 3 };
    char names[JOIN_MAX][SHOAL_TENSOR_NAME_BYTES_MAX];
    const char *np[JOIN_MAX];
    int64_t rows[JOIN_MAX], cols = 0;
    for (int i = 0; i < n; i++) {
        int dims;
        int64_t shape[3];
        model_tensor_shape(&m->cfg, roles[i], &dims, shape);
        np[i] = role_name(m, roles[i], l, 0, names[i]);
        rows[i] = shape[0];
        cols = shape[1];
    }
    return load_joined(m, np, rows, n, cols, out, joined, diag);
}

/* How load_f32 maps each stored value. */
typedef enum f32_map {
    F32_AS_IS = 0,
    F32_PLUS_ONE, /* a (1 + w) norm's weight */
    F32_NEG_EXP,  /* A_log to the decay rate -exp(A_log) */
} f32_map;

/* The tensor of `role` in layer l in F32 on the device (norms, the conv,
 * A_log: small), its rows (first dim) reordered by perm (row i the stored
 * row perm[i]; NULL: as stored), each value mapped. */
static shoal_err load_f32(worker_model *m, model_role role, int l, const int32_t *perm,
                          f32_map map, float **out, shoal_diag *diag)
{
    char name[SHOAL_TENSOR_NAME_BYTES_MAX];
    int dims;
    int64_t shape[3];
    model_tensor_shape(&m->cfg, role, &dims, shape);
    role_name(m, role, l, 0, name);
    model_tensor_ref t;
    shoal_err err = model_weights_get(m->weights, name, dims, shape, &t, diag);
    if (err)
        return err;
    size_t n = 1;
    for (int i = 0; i < dims; i++)
        n *= (size_t)shape[i];
    size_t row = n / (size_t)shape[0];
    float *host = malloc(n * sizeof *host);
    if (!host)
        return SHOAL_ERR_NOMEM;
    for (size_t i = 0; i < n; i++) {
        size_t src = perm ? (size_t)perm[i / row] * row + i % row : i;
        float v = shoal_load_f32(t.data, t.dtype, src);
        host[i] = map == F32_PLUS_ONE ? 1.0f + v : map == F32_NEG_EXP ? -expf(v) : v;
    }
    const void *dev = NULL;
    err = dev_place(m, host, n * sizeof *host, false, &dev);
    free(host);
    *out = (float *)dev;
    return err ? shoal_diag_set(diag, err, "tensor '%s': cannot place it on the device", name)
               : SHOAL_OK;
}

/* The rows rows[0..n) of the matrix of `role` in layer l, in that order,
 * as one matrix (the backend's own copy). tag tells apart, in dummy
 * weights, matrices cut from one tensor. */
static shoal_err load_rows(worker_model *m, model_role role, int l, const int32_t *rows, int n,
                           const char *tag, model_matrix *out, shoal_diag *diag)
{
    char name[SHOAL_TENSOR_NAME_BYTES_MAX];
    int dims;
    int64_t shape[3];
    model_tensor_shape(&m->cfg, role, &dims, shape);
    role_name(m, role, l, 0, name);
    if (model_weights_is_dummy(m->weights) && m->be->fill_random) {
        char tagged[SHOAL_TENSOR_NAME_BYTES_MAX + 16];
        snprintf(tagged, sizeof tagged, "%s#%s", name, tag);
        return load_matrix(m, tagged, n, shape[1], out, diag);
    }
    model_tensor_ref t;
    shoal_err err = model_weights_get(m->weights, name, 2, shape, &t, diag);
    if (err)
        return err;
    size_t row_bytes = (size_t)shape[1] * shoal_dtype_bytes(t.dtype);
    unsigned char *host = malloc((size_t)n * row_bytes);
    if (!host)
        return SHOAL_ERR_NOMEM;
    for (int i = 0; i < n; i++)
        memcpy(host + (size_t)i * row_bytes, (const unsigned char *)t.data + (size_t)rows[i] * row_bytes,
               row_bytes);
    *out = (model_matrix){.dtype = t.dtype, .rows = n, .cols = shape[1], .experts = 1};
    err = dev_place(m, host, (size_t)n * row_bytes, false, &out->data);
    free(host);
    return err ? shoal_diag_set(diag, err, "tensor '%s': cannot place it on the device", name)
               : SHOAL_OK;
}

/* The order of a head's dims for partial rope (rope_dim of head_dim
 * rotated, as rotate_half pairs dim i with i + rope_dim / 2): the
 * rotated pairs first in each half, so that the rope op, which pairs i
 * with i + head_dim / 2, rotates them, and the others sit at frequency 0
 * (model_config_rope_inv_freq), where the rotation is the identity. q
 * and k are reordered alike, so their products are unchanged. perm[i] is
 * the stored dim of dim i. */
static void rope_dim_order(const model_config *c, int32_t *perm)
{
    int half = c->head_dim / 2, rot = c->rope_dim / 2, rest = half - rot;
    for (int j = 0; j < rot; j++) {
        perm[j] = j;
        perm[half + j] = rot + j;
    }
    for (int t = 0; t < rest; t++) {
        perm[rot + t] = 2 * rot + t;
        perm[half + rot + t] = 2 * rot + rest + t;
    }
}

/* A gated attention layer's q (query rows of each head, dims in
 * rope_dim_order), its gate and k (likewise), v and o; the norms of q
 * and k in the same order. */
static shoal_err load_gated_attention(worker_model *m, int l, shoal_diag *diag)
{
    const model_config *c = &m->cfg;
    model_layer *L = &m->layers[l];
    int hd = c->head_dim, q_w = c->heads * hd, kv_w = c->kv_heads * hd;
    int32_t order[SHOAL_MODEL_HEAD_DIM_MAX];
    rope_dim_order(c, order);
    int32_t *rows = malloc((size_t)(2 * q_w) * sizeof *rows);
    if (!rows)
        return SHOAL_ERR_NOMEM;
    for (int h = 0; h < c->heads; h++)
        for (int d = 0; d < hd; d++) {
            rows[h * hd + d] = h * 2 * hd + order[d];         /* query */
            rows[q_w + h * hd + d] = h * 2 * hd + hd + d;     /* gate */
        }
    shoal_err err;
    if ((err = load_rows(m, MODEL_ROLE_Q, l, rows, q_w, "query", &L->q, diag)) ||
        (err = load_rows(m, MODEL_ROLE_Q, l, rows + q_w, q_w, "gate", &L->q_gate, diag)))
        goto out;
    for (int h = 0; h < c->kv_heads; h++)
        for (int d = 0; d < hd; d++)
            rows[h * hd + d] = h * hd + order[d];
    if ((err = load_rows(m, MODEL_ROLE_K, l, rows, kv_w, "k", &L->k, diag)) ||
        (err = load_role_matrix(m, MODEL_ROLE_V, l, &L->v, diag)) ||
        (err = load_role_matrix(m, MODEL_ROLE_O, l, &L->o, diag)) ||
        (err = load_f32(m, MODEL_ROLE_Q_NORM, l, order, F32_PLUS_ONE, &L->q_norm, diag)) ||
        (err = load_f32(m, MODEL_ROLE_K_NORM, l, order, F32_PLUS_ONE, &L->k_norm, diag)))
        goto out;
out:
    free(rows);
    return err;
}

/* A gated DeltaNet layer's weights. Qwen3-Next's in_proj_qkvz holds, for
 * each key head g, q (k_dim rows), k (k_dim), then the v and z rows of its
 * r = v_heads / k_heads value heads; in_proj_ba, per key head, its value
 * heads' b then a rows. They are regrouped here into Qwen3.5's
 * [q of every head | k | v] and z, b, a. */
static shoal_err load_linear(worker_model *m, int l, shoal_diag *diag)
{
    const model_config *c = &m->cfg;
    model_layer *L = &m->layers[l];
    int nk = c->lin_k_heads, nv = c->lin_v_heads, dk = c->lin_k_dim, dv = c->lin_v_dim;
    int r = nv / nk, kd = nk * dk, vd = nv * dv, cd = model_config_lin_conv_dim(c);
    shoal_err err = SHOAL_OK;
    if (c->linear_fused) {
        int block = 2 * dk + 2 * r * dv;
        int32_t *rows = malloc((size_t)(cd + vd + 2 * nv) * sizeof *rows);
        if (!rows)
            return SHOAL_ERR_NOMEM;
        int32_t *z = rows + cd, *b = z + vd, *a = b + nv;
        for (int g = 0; g < nk; g++) {
            for (int i = 0; i < dk; i++) {
                rows[g * dk + i] = g * block + i;
                rows[kd + g * dk + i] = g * block + dk + i;
            }
            for (int i = 0; i < r * dv; i++) {
                rows[2 * kd + g * r * dv + i] = g * block + 2 * dk + i;
                z[g * r * dv + i] = g * block + 2 * dk + r * dv + i;
            }
            for (int j = 0; j < r; j++) {
                b[g * r + j] = g * 2 * r + j;
                a[g * r + j] = g * 2 * r + r + j;
            }
        }
        if ((err = load_rows(m, MODEL_ROLE_LIN_QKVZ, l, rows, cd, "qkv", &L->lin_qkv, diag)) ||
            (err = load_rows(m, MODEL_ROLE_LIN_QKVZ, l, z, vd, "z", &L->lin_z, diag)) ||
            (err = load_rows(m, MODEL_ROLE_LIN_BA, l, b, nv, "b", &L->lin_b, diag)) ||
            (err = load_rows(m, MODEL_ROLE_LIN_BA, l, a, nv, "a", &L->lin_a, diag))) {
            free(rows);
            return err;
        }
        free(rows);
    } else {
        /* [q | k | v], b and a back to back where they can be: one matmul
         * of cd + 2 nv rows (z's rows go to their own buffer) */
        static const model_role qkvba[3] = {MODEL_ROLE_LIN_QKV, MODEL_ROLE_LIN_B,
                                            MODEL_ROLE_LIN_A};
        model_matrix *const out[3] = {&L->lin_qkv, &L->lin_b, &L->lin_a};
        if ((err = load_role_joined(m, qkvba, 3, l, out, &L->lin_joined, diag)) ||
            (err = load_role_matrix(m, MODEL_ROLE_LIN_Z, l, &L->lin_z, diag)))
            return err;
    }
    return (err = load_f32(m, MODEL_ROLE_LIN_CONV, l, NULL, F32_AS_IS, &L->lin_conv, diag)) ||
                   (err = load_f32(m, MODEL_ROLE_LIN_A_LOG, l, NULL, F32_NEG_EXP, &L->lin_decay,
                                   diag)) ||
                   (err = load_f32(m, MODEL_ROLE_LIN_DT_BIAS, l, NULL, F32_AS_IS, &L->lin_dt_bias,
                                   diag)) ||
                   (err = load_f32(m, MODEL_ROLE_LIN_NORM, l, NULL, F32_AS_IS, &L->lin_norm,
                                   diag)) ||
                   (err = load_role_matrix(m, MODEL_ROLE_LIN_OUT, l, &L->lin_out, diag))
               ? err
               : SHOAL_OK;
}

/* Every expert's matrix of `role` in layer l, stacked in one device array
 * [experts][rows][cols] of one dtype (HF checkpoints keep each expert as
 * its own tensor). */
static shoal_err load_experts(worker_model *m, model_role role, int l, model_matrix *out,
                              shoal_diag *diag)
{
    const model_config *c = &m->cfg;
    char name[SHOAL_TENSOR_NAME_BYTES_MAX];
    int dims;
    int64_t shape[3];
    model_tensor_shape(c, role, &dims, shape);
    size_t elems = (size_t)shape[0] * (size_t)shape[1];
    bool dummy = model_weights_is_dummy(m->weights) && m->be->fill_random;
    shoal_dtype dt = SHOAL_DTYPE_BF16;
    model_tensor_ref t;
    shoal_err err;
    if (!dummy) {
        if ((err =
                 model_weights_get(m->weights, role_name(m, role, l, 0, name), 2, shape, &t, diag)))
            return err;
        dt = t.dtype;
    }
    size_t one = elems * shoal_dtype_bytes(dt);
    unsigned char *dst = dev_alloc(m, one * (size_t)c->experts);
    if (!dst)
        return shoal_diag_set(diag, SHOAL_ERR_NOMEM,
                              "layer %d: cannot place %d experts of %zu bytes on the device", l,
                              c->experts, one);
    *out = (model_matrix){
        .data = dst, .dtype = dt, .rows = shape[0], .cols = shape[1], .experts = c->experts};
    for (int e = 0; e < c->experts; e++, dst += one) {
        role_name(m, role, l, e, name);
        if (dummy) {
            uint64_t state;
            float base, scale;
            model_weights_dummy_recipe(m->weights, name, 2, &state, &base, &scale);
            m->be->fill_random(m->be, dst, elems, state, base, scale);
            continue;
        }
        if ((err = model_weights_get(m->weights, name, 2, shape, &t, diag)))
            return err;
        if (t.dtype != dt)
            return shoal_diag_set(diag, SHOAL_ERR_UNSUPPORTED,
                                  "tensor '%s' is %s where expert 0 is %s: a layer's experts "
                                  "must share a dtype",
                                  name, shoal_dtype_name(t.dtype), shoal_dtype_name(dt));
        if ((err = m->be->upload(m->be, dst, t.data, one)))
            return shoal_diag_set(diag, err, "tensor '%s': cannot upload it", name);
    }
    return SHOAL_OK;
}

/* The blocks' weights of layer l, by the architecture's tensor table. */
static shoal_err load_layer(worker_model *m, int l, shoal_diag *diag)
{
    const model_config *c = &m->cfg;
    model_layer *L = &m->layers[l];
    shoal_err err;
    static const model_role qkv_roles[] = {MODEL_ROLE_Q, MODEL_ROLE_K, MODEL_ROLE_V};
    static const model_role gu_roles[] = {MODEL_ROLE_GATE, MODEL_ROLE_UP};
    model_matrix *qkv[] = {&L->q, &L->k, &L->v}, *gu[] = {&L->gate, &L->up};
    f32_map norm = c->norm_offset ? F32_PLUS_ONE : F32_AS_IS;
    L->linear = c->mixer_kind[l] == MODEL_MIXER_LINEAR;
    for (int i = 0; i < l; i++)
        L->state_layer += c->mixer_kind[i] == MODEL_MIXER_LINEAR;
    if ((err = load_f32(m, MODEL_ROLE_ATTN_NORM, l, NULL, norm, &L->attn_norm, diag)) ||
        (err = load_f32(m, MODEL_ROLE_MLP_NORM, l, NULL, norm, &L->mlp_norm, diag)))
        return err;
    if (L->linear) {
        if ((err = load_linear(m, l, diag)))
            return err;
    } else if (c->attn_output_gate) {
        if ((err = load_gated_attention(m, l, diag)))
            return err;
    } else {
        if ((err = load_role_joined(m, qkv_roles, 3, l, qkv, &L->qkv_joined, diag)) ||
            (err = load_role_matrix(m, MODEL_ROLE_O, l, &L->o, diag)))
            return err;
        if (c->qk_norm &&
            ((err = load_f32(m, MODEL_ROLE_Q_NORM, l, NULL, F32_AS_IS, &L->q_norm, diag)) ||
             (err = load_f32(m, MODEL_ROLE_K_NORM, l, NULL, F32_AS_IS, &L->k_norm, diag))))
            return err;
    }
    L->moe = c->mlp_kind[l] == MODEL_MLP_MOE;
    if (!L->moe) {
        if ((err = load_role_joined(m, gu_roles, 2, l, gu, &L->gate_up_joined, diag)) ||
            (err = load_role_matrix(m, MODEL_ROLE_DOWN, l, &L->down, diag)))
            return err;
        return SHOAL_OK;
    }
    if ((err = load_role_matrix(m, MODEL_ROLE_ROUTER, l, &L->router, diag)) ||
        (err = load_experts(m, MODEL_ROLE_EXPERT_GATE, l, &L->experts_gate, diag)) ||
        (err = load_experts(m, MODEL_ROLE_EXPERT_UP, l, &L->experts_up, diag)) ||
        (err = load_experts(m, MODEL_ROLE_EXPERT_DOWN, l, &L->experts_down, diag)))
        return err;
    L->shared = c->shared_intermediate > 0;
    if (L->shared &&
        ((err = load_role_matrix(m, MODEL_ROLE_SHARED_GATE, l, &L->shared_gate, diag)) ||
         (err = load_role_matrix(m, MODEL_ROLE_SHARED_UP, l, &L->shared_up, diag)) ||
         (err = load_role_matrix(m, MODEL_ROLE_SHARED_DOWN, l, &L->shared_down, diag)) ||
         (err = load_role_matrix(m, MODEL_ROLE_SHARED_EXPERT_GATE, l, &L->shared_expert_gate,
                                 diag))))
        return err;
    return SHOAL_OK;
}

/* Where the backend takes the RMSNorm inside its matmuls (kernels_backend.h:
 * fused_norm_rows) and every layer's matrices are BF16 (rows of whole
 * 16-byte chunks):
 * each norm's weight folded into the columns of the matmuls after it, and
 * the norm's weight then ones, so that passes of more rows (the norm pass,
 * then the matmul) compute the same function as the fused ones. Every
 * layer or none: a fused layer's residual is added where it is made, and
 * the next layer's norm expects it there. */
static shoal_err fold_norms(worker_model *m, shoal_diag *diag)
{
    kernels_backend *be = m->be;
    const model_config *c = &m->cfg;
    int q_out = c->heads * c->head_dim, kv_out = c->kv_heads * c->head_dim;
    /* the GEMV's rows: 16-byte chunks */
    bool whole = c->hidden % 8 == 0 && c->intermediate % 8 == 0 && q_out % 8 == 0;
    /* a MoE layer's norm would fold into its router and every expert, a
     * hybrid's into its DeltaNet and gated projections: not done, so such
     * models take the norm pass */
    if (be->fused_norm_rows < 1 || !be->scale_columns || be->act_dtype != SHOAL_DTYPE_BF16 ||
        !whole || model_config_has_moe(c) || model_config_has_linear(c) || c->attn_output_gate)
        return SHOAL_OK;
    SHOAL_ASSERT(!be->host_memory); /* the weights are the backend's own copies */
    for (int l = 0; l < c->layers; l++) {
        const model_layer *L = &m->layers[l];
        const model_matrix *w[] = {&L->q, &L->k, &L->v, &L->o, &L->gate, &L->up, &L->down};
        for (int i = 0; i < 7; i++)
            if (w[i]->dtype != SHOAL_DTYPE_BF16)
                return SHOAL_OK;
    }
    float *ones = malloc((size_t)c->hidden * sizeof *ones);
    if (!ones)
        return SHOAL_ERR_NOMEM;
    for (int i = 0; i < c->hidden; i++)
        ones[i] = 1.0f;
    shoal_err err = SHOAL_OK;
    for (int l = 0; l < c->layers && !err; l++) {
        model_layer *L = &m->layers[l];
        const struct {
            const model_matrix *w;
            int rows;
            float *norm;
        } fold[] = {{&L->q, q_out, L->attn_norm},
                    {&L->k, kv_out, L->attn_norm},
                    {&L->v, kv_out, L->attn_norm},
                    {&L->gate, c->intermediate, L->mlp_norm},
                    {&L->up, c->intermediate, L->mlp_norm}};
        for (int i = 0; i < 5; i++)
            be->scale_columns(be, (void *)fold[i].w->data, SHOAL_DTYPE_BF16, fold[i].rows,
                              c->hidden, fold[i].norm);
        /* queued after the scaling that reads them */
        size_t bytes = (size_t)c->hidden * sizeof *ones;
        if ((err = be->upload(be, L->attn_norm, ones, bytes)) ||
            (err = be->upload(be, L->mlp_norm, ones, bytes)))
            shoal_diag_set(diag, err, "layer %d: cannot fold its norms into its weights", l);
    }
    if (!err)
        err = be->sync(be);
    free(ones);
    m->norm_fused = !err;
    return err;
}

static shoal_err check_options(const worker_model_options *o, shoal_diag *diag)
{
    if (o->page_tokens < SHOAL_PAGE_TOKENS_MIN || o->page_tokens > SHOAL_PAGE_TOKENS_MAX ||
        (o->page_tokens & (o->page_tokens - 1)) != 0)
        return shoal_diag_set(diag, SHOAL_ERR_INVALID,
                              "page tokens %d: must be a power of two in [%d, %d]", o->page_tokens,
                              SHOAL_PAGE_TOKENS_MIN, SHOAL_PAGE_TOKENS_MAX);
    if (o->max_rows < 1 || o->max_rows > SHOAL_BATCH_ROWS_MAX)
        return shoal_diag_set(diag, SHOAL_ERR_INVALID, "max rows %d: must be in [1, %d]",
                              o->max_rows, SHOAL_BATCH_ROWS_MAX);
    if (o->max_streams < 1 || o->max_streams > SHOAL_BATCH_STREAMS_MAX)
        return shoal_diag_set(diag, SHOAL_ERR_INVALID, "max streams %d: must be in [1, %d]",
                              o->max_streams, SHOAL_BATCH_STREAMS_MAX);
    if (o->max_logit_rows < 1 || o->max_logit_rows > o->max_rows)
        return shoal_diag_set(diag, SHOAL_ERR_INVALID,
                              "max logit rows %d: must be in [1, max rows %d]", o->max_logit_rows,
                              o->max_rows);
    if (o->state_slots < 0 || o->state_slots > SHOAL_STATE_SLOTS_MAX)
        return shoal_diag_set(diag, SHOAL_ERR_INVALID, "state slots %d: must be in [0, %d]",
                              o->state_slots, SHOAL_STATE_SLOTS_MAX);
    if (o->kv_dtype != SHOAL_DTYPE_BF16 && o->kv_dtype != SHOAL_DTYPE_F8_E4M3 &&
        o->kv_dtype != SHOAL_DTYPE_F32)
        return shoal_diag_set(diag, SHOAL_ERR_INVALID,
                              "kv dtype %s: must be BF16, F8_E4M3 or F32 (CPU only)",
                              shoal_dtype_name(o->kv_dtype));
    if (o->kv_pages < 0 || o->max_pages_per_stream < 1 || o->kv_memory_fraction < 0.0 ||
        o->kv_memory_fraction > 1.0 ||
        (int64_t)o->max_pages_per_stream * o->page_tokens > SHOAL_CONTEXT_TOKENS_MAX)
        return shoal_diag_set(diag, SHOAL_ERR_INVALID,
                              "kv pages %d, pages per stream %d: need pages (0 for automatic), a "
                              "memory fraction in [0, 1], and at most %d tokens per stream",
                              o->kv_pages, o->max_pages_per_stream, SHOAL_CONTEXT_TOKENS_MAX);
    return SHOAL_OK;
}

static shoal_err alloc_buffers(worker_model *m, shoal_diag *diag)
{
    const model_config *c = &m->cfg;
    size_t a = kernels_act_bytes(m->be);
    size_t rows = (size_t)m->opt.max_rows;
    size_t q_w = (size_t)c->heads * (size_t)c->head_dim;
    size_t kv_w = (size_t)c->kv_heads * (size_t)c->head_dim;
    size_t hid = (size_t)c->hidden, inter = (size_t)c->intermediate;
    if (inter < (size_t)c->shared_intermediate)
        inter = (size_t)c->shared_intermediate;
    if (inter == 0) /* every MLP a mixture of experts */
        inter = 1;
    size_t vd = (size_t)c->lin_v_heads * (size_t)c->lin_v_dim;
    size_t att_w = q_w > vd ? q_w : vd; /* attention's or the DeltaNet's output */
    size_t wide = hid > q_w ? hid : q_w;
    /* Penalty lists name each distinct token of a stream once: at most its
     * context, for every row that samples. */
    int64_t pen = (int64_t)m->opt.max_logit_rows * m->opt.max_pages_per_stream * m->opt.page_tokens;
    m->pen_cap = pen > (1 << 26) ? (1 << 26) : (int)pen;
    m->stage_bytes = step_layout_of(m->opt.max_rows, m->opt.max_logit_rows, m->opt.max_streams,
                                    m->opt.max_pages_per_stream)
                         .bytes;
    m->stage = malloc(m->stage_bytes);
    m->seg_row0 = malloc(rows * sizeof *m->seg_row0);
    m->seg_rows = malloc(rows * sizeof *m->seg_rows);
    m->seg_prompt = malloc(rows * sizeof *m->seg_prompt);
    m->seg_single = malloc(rows * sizeof *m->seg_single);
    m->graph_rows = 0;
    if (m->be->graph_begin) {
        int per_kind = m->be->graph_slots / RUN_KINDS;
        m->graph_rows = m->opt.max_logit_rows < per_kind ? m->opt.max_logit_rows : per_kind;
    }
    m->graph_ready = calloc((size_t)RUN_KINDS * (size_t)(m->graph_rows + 1), sizeof(bool));
    if (!m->stage || !m->seg_row0 || !m->seg_rows || !m->seg_prompt || !m->seg_single ||
        !m->graph_ready)
        return shoal_diag_set(diag, SHOAL_ERR_NOMEM, "no host memory for the step buffers");
    bool ok = (m->dstage = dev_alloc(m, m->stage_bytes)) && (m->x = dev_alloc(m, rows * hid * a)) &&
              (m->h = dev_alloc(m, rows * hid * a)) && (m->q = dev_alloc(m, rows * q_w * a)) &&
              (m->k = dev_alloc(m, rows * kv_w * a)) && (m->v = dev_alloc(m, rows * kv_w * a)) &&
              (m->att = dev_alloc(m, rows * att_w * a)) &&
              (m->pend = dev_alloc(m, rows * wide * a)) &&
              /* up right after gate: one batched GEMM of both (CUDA) */
              (m->gate = dev_alloc(m, 2 * rows * inter * a)) &&
              (m->sel = dev_alloc(m, (size_t)m->opt.max_logit_rows * hid * a)) &&
              (m->logits = dev_alloc(m, (size_t)m->opt.max_logit_rows * (size_t)c->vocab * 4)) &&
              (m->results = dev_alloc(m, (size_t)m->opt.max_logit_rows * sizeof *m->results)) &&
              (m->pen_offsets = dev_alloc(m, (size_t)(m->opt.max_logit_rows + 1) * 4)) &&
              (m->pen_tokens = dev_alloc(m, (size_t)m->pen_cap * 4)) &&
              (m->pen_counts = dev_alloc(m, (size_t)m->pen_cap * 4));
    if (!ok)
        return shoal_diag_set(diag, SHOAL_ERR_NOMEM,
                              "no memory for activations of %d rows; lower the batch size",
                              m->opt.max_rows);
    m->up = (unsigned char *)m->gate + rows * inter * a;
    if (model_config_has_moe(c)) {
        kernels_backend *be = m->be;
        if (!be->moe_route || !be->moe_experts)
            return shoal_diag_set(diag, SHOAL_ERR_UNSUPPORTED,
                                  "the %s backend has no mixture-of-experts ops", be->name);
        size_t routes = (size_t)c->layers * rows * (size_t)c->experts_per_tok;
        ok = (m->router_logits = dev_alloc(m, rows * (size_t)c->experts * 4)) &&
             (m->route_ids = dev_alloc(m, routes * 4)) &&
             (m->route_weights = dev_alloc(m, routes * 4)) &&
             (m->moe_scratch =
                  dev_alloc(m, be->moe_scratch_bytes(be, m->opt.max_rows, c->experts_per_tok,
                                                     c->moe_intermediate, c->hidden)));
        if (!ok)
            return shoal_diag_set(diag, SHOAL_ERR_NOMEM,
                                  "no memory for the experts' buffers of %d rows; lower the batch "
                                  "size",
                                  m->opt.max_rows);
    }
    if (c->attn_output_gate && !(m->att_gate = dev_alloc(m, rows * q_w * a)))
        return shoal_diag_set(diag, SHOAL_ERR_NOMEM,
                              "no memory for the attention gates of %d rows; lower the batch size",
                              m->opt.max_rows);
    if (c->shared_intermediate > 0 && (!(m->shared_out = dev_alloc(m, rows * hid * a)) ||
                                       !(m->shared_logit = dev_alloc(m, rows * a))))
        return shoal_diag_set(diag, SHOAL_ERR_NOMEM,
                              "no memory for the shared experts' buffers of %d rows; lower the "
                              "batch size",
                              m->opt.max_rows);
    if (model_config_has_linear(c)) {
        kernels_backend *be = m->be;
        if (!be->deltanet_conv || !be->deltanet_rule || !be->rmsnorm_gated || !be->mul_sigmoid ||
            !be->add)
            return shoal_diag_set(diag, SHOAL_ERR_UNSUPPORTED,
                                  "the %s backend has no gated DeltaNet ops yet; run this model "
                                  "on the CPU (--device cpu)",
                                  be->name);
        /* the projection [q | k | v], the conv's output, z, b and a */
        size_t cd = (size_t)model_config_lin_conv_dim(c), nv = (size_t)c->lin_v_heads;
        m->slot_bytes = model_cache_slot_bytes(&m->cache);
        size_t states = (size_t)m->opt.state_slots * m->slot_bytes;
        if (!(m->lin_scratch = dev_alloc(m, rows * (2 * cd + vd + 2 * nv) * a)))
            return shoal_diag_set(diag, SHOAL_ERR_NOMEM,
                                  "no memory for the DeltaNet buffers of %d rows; lower the batch "
                                  "size",
                                  m->opt.max_rows);
        if (!(m->states = dev_alloc(m, states)))
            return shoal_diag_set(diag, SHOAL_ERR_NOMEM,
                                  "no memory for %d recurrent-state slots of %.1f MiB (%.1f GiB); "
                                  "lower --parallel",
                                  m->opt.state_slots, (double)m->slot_bytes / 1048576.0,
                                  (double)states / 1073741824.0);
    }
    /* The arena comes last: with kv_pages 0 it takes a share of what the
     * weights and buffers left, as vLLM sizes its KV cache. */
    if (m->opt.kv_pages == 0) {
        size_t free_bytes = 0, total_bytes = 0;
        if (m->be->mem_info(m->be, &free_bytes, &total_bytes))
            return shoal_diag_set(diag, SHOAL_ERR_DEVICE,
                                  "cannot read the device's free memory; give --kv-pages");
        double fraction = m->opt.kv_memory_fraction > 0.0 ? m->opt.kv_memory_fraction
                          : m->be->host_memory            ? 0.25
                                                          : 0.9;
        double pages = (double)free_bytes * fraction / (double)m->kv.page_bytes;
        double most = (double)m->opt.max_streams * m->opt.max_pages_per_stream;
        if (m->opt.kv_pages_max > 0 && most > m->opt.kv_pages_max)
            most = m->opt.kv_pages_max;
        pages = pages > most ? most : pages;
        if (pages < 1.0)
            return shoal_diag_set(diag, SHOAL_ERR_NOMEM,
                                  "%.1f GiB free leaves no room for one KV page of %zu bytes",
                                  (double)free_bytes / (1 << 30), m->kv.page_bytes);
        m->opt.kv_pages = (int)pages;
    }
    size_t arena_bytes = (size_t)m->opt.kv_pages * m->kv.page_bytes;
    shoal_err err =
        m->be->arena_create(m->be, arena_bytes, &m->arena, &m->arena_fd, &m->arena_bytes);
    if (err == SHOAL_ERR_NOMEM)
        return shoal_diag_set(diag, SHOAL_ERR_NOMEM,
                              "no memory for %d KV pages of %zu bytes (%.1f MiB); lower --kv-pages",
                              m->opt.kv_pages, m->kv.page_bytes, (double)arena_bytes / 1048576.0);
    if (err)
        return shoal_diag_set(
            diag, err,
            "cannot make the KV arena of %d pages (%.1f MiB) on device %s: %s (the "
            "log line before says why)",
            m->opt.kv_pages, (double)arena_bytes / 1048576.0, m->opt.device, shoal_strerror(err));
    return SHOAL_OK;
}

shoal_err worker_model_open(const worker_model_options *opt, worker_model **out, shoal_diag *diag)
{
    shoal_err err;
    *out = NULL;
    if ((err = check_options(opt, diag)))
        return err;
    worker_model *m = calloc(1, sizeof *m);
    if (!m)
        return SHOAL_ERR_NOMEM;
    m->opt = *opt;
    m->arena_fd = -1;
    if (m->opt.state_slots == 0)
        m->opt.state_slots = m->opt.max_streams;
    if ((err = model_config_load(opt->model_dir, &m->cfg, diag)))
        goto out_close;
    const model_config *c = &m->cfg;
    kernels_backend_options bo = {
        .device = opt->device, .threads = opt->threads, .act_dtype = opt->act_dtype,
        .cuda = opt->cuda};
    if ((err = kernels_backend_open(&bo, &m->be, diag)))
        goto out_close;
    err = opt->load_format == WORKER_LOAD_DUMMY
              ? model_weights_open_dummy(opt->dummy_seed, &m->weights)
              : model_weights_open(opt->model_dir, &m->weights, diag);
    if (err)
        goto out_close;
    m->layers = calloc((size_t)c->layers, sizeof *m->layers);
    if (!m->layers) {
        err = SHOAL_ERR_NOMEM;
        goto out_close;
    }
    if ((err = load_role_matrix(m, MODEL_ROLE_EMBED, 0, &m->embed, diag)))
        goto out_close;
    /* A tied checkpoint may still carry lm_head.weight; the embedding is
     * what transformers uses when tie_word_embeddings is set. */
    if (c->tie_embeddings)
        m->lm_head = m->embed;
    else if ((err = load_role_matrix(m, MODEL_ROLE_LM_HEAD, 0, &m->lm_head, diag)))
        goto out_close;
    if ((err = load_f32(m, MODEL_ROLE_FINAL_NORM, 0, NULL,
                        c->norm_offset ? F32_PLUS_ONE : F32_AS_IS, &m->final_norm, diag)))
        goto out_close;
    for (int i = 0; i < c->layers; i++)
        if ((err = load_layer(m, i, diag)))
            goto out_close;
    if ((err = fold_norms(m, diag)))
        goto out_close;
    float inv[SHOAL_MODEL_HEAD_DIM_MAX / 2];
    model_config_rope_inv_freq(c, inv);
    const void *inv_dev;
    if ((err = dev_place(m, inv, (size_t)(c->head_dim / 2) * sizeof(float), false, &inv_dev)))
        goto out_close;
    m->inv_freq = (float *)inv_dev;
    model_cache_spec_of(c, &m->cache);
    const model_cache_group *att = model_cache_attention(&m->cache);
    if (!att) {
        err = shoal_diag_set(diag, SHOAL_ERR_UNSUPPORTED,
                             "%s: no full-attention layer; shoal needs at least one",
                             c->arch_name);
        goto out_close;
    }
    if (model_weights_has(m->weights, "model.visual.patch_embed.proj.weight"))
        LOG_INFO("%s: the vision tower (model.visual.*) is not loaded: shoal serves the text "
                 "model",
                 c->arch_name);
    if (opt->kv_dtype == SHOAL_DTYPE_F32 && !m->be->kv_f32) {
        err = shoal_diag_set(diag, SHOAL_ERR_UNSUPPORTED,
                             "F32 KV pages: the %s backend keeps BF16 or FP8 pages; use "
                             "--kv-dtype bf16 or fp8",
                             m->be->name);
        goto out_close;
    }
    kernels_kv_layout_init(&m->kv, att->layers, att->kv_heads, att->head_dim, opt->page_tokens,
                           opt->kv_dtype);
    if ((err = alloc_buffers(m, diag)))
        goto out_close;
    if ((err = worker_fingerprint_compute(opt->model_dir, m->weights, opt->dummy_seed, m->kv.dtype,
                                          opt->page_tokens, &m->fingerprint, diag)))
        goto out_close;
    *out = m;
    return SHOAL_OK;
out_close:
    worker_model_close(m);
    return err;
}

void worker_model_close(worker_model *m)
{
    if (!m)
        return;
    for (int i = 0; i < m->owned_count; i++)
        m->be->free(m->be, m->owned[i]);
    free(m->owned);
    /* Workers that mapped the arena keep their mappings (and the memory). */
    if (m->arena)
        m->be->arena_unmap(m->be, m->arena, m->arena_bytes);
    if (m->arena_fd >= 0)
        close(m->arena_fd);
    free(m->layers);
    free(m->stage);
    free(m->seg_row0);
    free(m->seg_rows);
    free(m->seg_prompt);
    free(m->seg_single);
    free(m->graph_ready);
    model_weights_close(m->weights);
    kernels_backend_close(m->be);
    free(m);
}

const model_config *worker_model_config(const worker_model *m)
{
    return &m->cfg;
}

const model_cache_spec *worker_model_cache_spec(const worker_model *m)
{
    return &m->cache;
}

const kernels_kv_layout *worker_model_kv_layout(const worker_model *m)
{
    return &m->kv;
}

int worker_model_kv_pages(const worker_model *m)
{
    return m->opt.kv_pages;
}

int worker_model_state_slots(const worker_model *m)
{
    return m->slot_bytes ? m->opt.state_slots : 0;
}

size_t worker_model_slot_bytes(const worker_model *m)
{
    return m->slot_bytes;
}

static shoal_err check_slot(const worker_model *m, int slot, shoal_diag *diag)
{
    if (m->slot_bytes == 0 || slot < 0 || slot >= m->opt.state_slots)
        return shoal_diag_set(diag, SHOAL_ERR_INVALID, "state slot %d: the model has %d", slot,
                              worker_model_state_slots(m));
    return SHOAL_OK;
}

static unsigned char *slot_at(const worker_model *m, int slot)
{
    return (unsigned char *)m->states + (size_t)slot * m->slot_bytes;
}

shoal_err worker_model_slot_read(worker_model *m, int slot, void *host, shoal_diag *diag)
{
    shoal_err err = check_slot(m, slot, diag);
    if (!err && (err = m->be->download(m->be, host, slot_at(m, slot), m->slot_bytes)))
        shoal_diag_set(diag, err, "state slot %d: cannot download it", slot);
    return err;
}

shoal_err worker_model_slot_write(worker_model *m, int slot, const void *host, shoal_diag *diag)
{
    shoal_err err = check_slot(m, slot, diag);
    if (!err && (err = m->be->upload(m->be, slot_at(m, slot), host, m->slot_bytes)))
        shoal_diag_set(diag, err, "state slot %d: cannot upload it", slot);
    return err;
}

shoal_err worker_model_slot_copy(worker_model *m, int dst, int src, shoal_diag *diag)
{
    shoal_err err = check_slot(m, dst, diag);
    if (!err)
        err = check_slot(m, src, diag);
    if (!err && dst != src &&
        (err = m->be->copy(m->be, slot_at(m, dst), slot_at(m, src), m->slot_bytes)))
        shoal_diag_set(diag, err, "state slot %d: cannot copy slot %d into it", dst, src);
    return err;
}

int worker_model_arena_fd(const worker_model *m)
{
    return m->arena_fd;
}

void *worker_model_arena(const worker_model *m)
{
    return m->arena;
}

size_t worker_model_arena_bytes(const worker_model *m)
{
    return m->arena_bytes;
}

int worker_model_max_rows(const worker_model *m)
{
    return m->opt.max_rows;
}

int worker_model_max_logit_rows(const worker_model *m)
{
    return m->opt.max_logit_rows;
}

int worker_model_max_streams(const worker_model *m)
{
    return m->opt.max_streams;
}

int worker_model_graph_rows(const worker_model *m)
{
    return m->graph_rows;
}

int worker_model_max_pages_per_stream(const worker_model *m)
{
    return m->opt.max_pages_per_stream;
}

int worker_model_penalty_cap(const worker_model *m)
{
    return m->pen_cap;
}

const common_hash *worker_model_fingerprint(const worker_model *m)
{
    return &m->fingerprint;
}

kernels_backend *worker_model_backend(worker_model *m)
{
    return m->be;
}

/* A hybrid's pass: each stream's slot in range and its own, its rows one
 * run of consecutive positions (the recurrent state is a chain). */
static shoal_err check_states(const worker_model *m, const worker_forward *f, shoal_diag *diag)
{
    for (int s = 0; s < f->streams; s++) {
        int slot = f->state_slots ? f->state_slots[s] : s;
        if (slot < 0 || slot >= m->opt.state_slots)
            return shoal_diag_set(diag, SHOAL_ERR_INVALID,
                                  "forward: stream %d: state slot %d outside [0, %d)", s, slot,
                                  m->opt.state_slots);
        for (int t = 0; t < s && f->state_slots; t++)
            if (f->state_slots[t] == slot)
                return shoal_diag_set(diag, SHOAL_ERR_INVALID,
                                      "forward: streams %d and %d share state slot %d", t, s, slot);
    }
    bool seen[SHOAL_BATCH_STREAMS_MAX] = {false};
    for (int r = 0; r < f->rows; r++) {
        int s = f->row_stream[r];
        bool cont = r > 0 && f->row_stream[r - 1] == s;
        if (cont ? f->positions[r] != f->positions[r - 1] + 1 : seen[s])
            return shoal_diag_set(diag, SHOAL_ERR_INVALID,
                                  "forward: row %d: a hybrid model's stream %d needs its rows "
                                  "together at consecutive positions",
                                  r, s);
        seen[s] = true;
    }
    return SHOAL_OK;
}

/* Everything a pass reads from the caller is checked here, before any op
 * runs: a bad id or page would otherwise read or write outside a buffer. */
static shoal_err check_forward(const worker_model *m, const worker_forward *f, shoal_diag *diag)
{
    const worker_model_options *o = &m->opt;
    if (f->rows < 1 || f->rows > o->max_rows)
        return shoal_diag_set(diag, SHOAL_ERR_LIMIT, "forward: %d rows, must be in [1, %d]",
                              f->rows, o->max_rows);
    if (f->streams < 1 || f->streams > o->max_streams)
        return shoal_diag_set(diag, SHOAL_ERR_LIMIT, "forward: %d streams, must be in [1, %d]",
                              f->streams, o->max_streams);
    if (f->page_table_stride < 1 || f->page_table_stride > o->max_pages_per_stream)
        return shoal_diag_set(diag, SHOAL_ERR_LIMIT,
                              "forward: page table stride %d, must be in [1, %d]",
                              f->page_table_stride, o->max_pages_per_stream);
    if (f->logit_count < 0 || f->logit_count > o->max_logit_rows)
        return shoal_diag_set(diag, SHOAL_ERR_LIMIT, "forward: %d logit rows, must be in [0, %d]",
                              f->logit_count, o->max_logit_rows);
    int32_t last_pos[SHOAL_BATCH_STREAMS_MAX];
    for (int s = 0; s < f->streams; s++)
        last_pos[s] = -1;
    int64_t capacity = (int64_t)f->page_table_stride * o->page_tokens;
    for (int r = 0; r < f->rows; r++) {
        if (f->token_ids[r] < 0 || f->token_ids[r] >= m->cfg.vocab)
            return shoal_diag_set(diag, SHOAL_ERR_INVALID,
                                  "forward: row %d: token id %d outside the vocabulary of %d", r,
                                  f->token_ids[r], m->cfg.vocab);
        if (f->row_stream[r] < 0 || f->row_stream[r] >= f->streams)
            return shoal_diag_set(diag, SHOAL_ERR_INVALID, "forward: row %d: stream %d of %d", r,
                                  f->row_stream[r], f->streams);
        if (f->positions[r] < 0 || f->positions[r] >= capacity)
            return shoal_diag_set(diag, SHOAL_ERR_INVALID,
                                  "forward: row %d: position %d outside its %lld page slots", r,
                                  f->positions[r], (long long)capacity);
        if (f->positions[r] > last_pos[f->row_stream[r]])
            last_pos[f->row_stream[r]] = f->positions[r];
    }
    for (int s = 0; s < f->streams; s++) {
        int used = last_pos[s] < 0 ? 0 : last_pos[s] / o->page_tokens + 1;
        for (int p = 0; p < used; p++) {
            int32_t page = f->page_table[(size_t)s * (size_t)f->page_table_stride + (size_t)p];
            if (page < 0 || page >= o->kv_pages)
                return shoal_diag_set(diag, SHOAL_ERR_INVALID,
                                      "forward: stream %d: page %d is %d, outside [0, %d)", s, p,
                                      page, o->kv_pages);
        }
    }
    for (int i = 0; i < f->logit_count; i++)
        if (f->logit_rows[i] < 0 || f->logit_rows[i] >= f->rows)
            return shoal_diag_set(diag, SHOAL_ERR_INVALID,
                                  "forward: logit row %d is %d, outside [0, %d)", i,
                                  f->logit_rows[i], f->rows);
    return m->slot_bytes ? check_states(m, f, diag) : SHOAL_OK;
}

/* Cuts the pass's rows into attention segments (see seg_row0). */
static void plan_attention(worker_model *m, const worker_forward *f)
{
    int n = 0;
    for (int r = 0; r < f->rows;) {
        int e = r + 1;
        while (e < f->rows && f->row_stream[e] == f->row_stream[r])
            e++;
        bool prompt = e - r >= WORKER_ATTN_PROMPT_ROWS && m->be->attention_prompt;
        if (n > 0 && m->seg_prompt[n - 1] == prompt) {
            m->seg_rows[n - 1] += e - r;
            m->seg_single[n - 1] = m->seg_single[n - 1] && e - r == 1;
        } else {
            m->seg_row0[n] = r;
            m->seg_rows[n] = e - r;
            m->seg_prompt[n] = prompt;
            m->seg_single[n] = e - r == 1;
            n++;
        }
        r = e;
    }
    m->segs = n;
}

/* Builds the step's inputs in the host stage, uploads them in one copy and
 * points the model's device pointers at them. The page table goes at
 * `stride` entries a stream (the forward's own, or the largest for a
 * recorded round, which must not change with the streams' lengths). */
static shoal_err stage_step(worker_model *m, const worker_forward *f,
                            const kernels_sample_params *params, int stride)
{
    step_layout L = step_layout_of(f->rows, f->logit_count, f->streams, stride);
    unsigned char *h = m->stage, *d = m->dstage;
    size_t r = (size_t)f->rows * 4;
    memcpy(h + L.ids, f->token_ids, r);
    memcpy(h + L.positions, f->positions, r);
    memcpy(h + L.row_stream, f->row_stream, r);
    if (f->logit_count > 0)
        memcpy(h + L.logit_rows, f->logit_rows, (size_t)f->logit_count * 4);
    if (params && f->logit_count > 0)
        memcpy(h + L.params, params, (size_t)f->logit_count * sizeof *params);
    if (stride == f->page_table_stride) {
        memcpy(h + L.page_table, f->page_table,
               (size_t)f->streams * (size_t)f->page_table_stride * 4);
    } else { /* entries past a stream's own stay as they are: nothing reads them */
        for (int s = 0; s < f->streams; s++)
            memcpy(h + L.page_table + (size_t)s * (size_t)stride * 4,
                   f->page_table + (size_t)s * (size_t)f->page_table_stride,
                   (size_t)f->page_table_stride * 4);
    }
    m->ids = (int32_t *)(d + L.ids);
    m->positions = (int32_t *)(d + L.positions);
    m->row_stream = (int32_t *)(d + L.row_stream);
    m->logit_rows = (int32_t *)(d + L.logit_rows);
    m->params = (kernels_sample_params *)(d + L.params);
    m->page_table = (int32_t *)(d + L.page_table);
    int32_t *slots = (int32_t *)(h + L.slots);
    for (int s = 0; s < f->streams; s++)
        slots[s] = f->state_slots ? f->state_slots[s] : s;
    m->slots = (int32_t *)(d + L.slots);
    return m->be->upload(m->be, d, h, L.bytes);
}

/* Whether the pass wants every row's logits, in row order. */
static bool logits_of_every_row(const worker_forward *f)
{
    if (f->logit_count != f->rows)
        return false;
    for (int i = 0; i < f->logit_count; i++)
        if (f->logit_rows[i] != i)
            return false;
    return true;
}

/* out = the layer's normed row x w^T: h's where the norm pass ran, else
 * x's with the norm taken inside the matmul (fused). */
static void normed_matmul(worker_model *m, bool fused, void *out, const model_matrix *w, int rows,
                          int n)
{
    kernels_backend *be = m->be;
    const model_config *c = &m->cfg;
    if (fused)
        be->matmul_rms(be, out, m->x, w->data, w->dtype, rows, n, c->hidden, c->rms_eps);
    else
        be->matmul(be, out, be->act_dtype, m->h, w->data, w->dtype, rows, n, c->hidden);
}

/* x += in x w^T, then h = rmsnorm(x) * norm: one op where the backend
 * takes it (true), else the product left in pend (false: the caller's
 * rmsnorm adds it as its residual). */
static bool matmul_add_norm(worker_model *m, const void *in, const model_matrix *w,
                            const float *norm, int rows, int k)
{
    kernels_backend *be = m->be;
    const model_config *c = &m->cfg;
    if (be->matmul_add_rmsnorm && be->matmul_add_rmsnorm(be, m->h, m->x, in, w->data, w->dtype,
                                                         norm, rows, c->hidden, k, c->rms_eps))
        return true;
    be->matmul(be, m->pend, be->act_dtype, in, w->data, w->dtype, rows, c->hidden, k);
    return false;
}

/* The mixture-of-experts block: router logits of the normed rows (h), the
 * routing (kept per layer for worker_model_routing), and the experts'
 * weighted sum into pend, which the next norm adds to x. */
static void moe_block(worker_model *m, const model_layer *L, int l, int rows)
{
    kernels_backend *be = m->be;
    const model_config *c = &m->cfg;
    int topk = c->experts_per_tok;
    size_t at = (size_t)l * (size_t)m->opt.max_rows * (size_t)topk;
    int32_t *ids = m->route_ids + at;
    float *w = m->route_weights + at;
    be->matmul(be, m->router_logits, SHOAL_DTYPE_F32, m->h, L->router.data, L->router.dtype, rows,
               c->experts, c->hidden);
    be->moe_route(be, ids, w, m->router_logits, rows, c->experts, topk, c->norm_topk_prob);
    be->moe_experts(be, m->pend, m->h, ids, w, rows, topk, &L->experts_gate, &L->experts_up,
                    &L->experts_down, m->moe_scratch);
    if (!L->shared)
        return;
    /* the shared expert, scaled by sigmoid(shared_expert_gate h), added */
    int si = c->shared_intermediate;
    be->matmul_swiglu(be, m->gate, m->up, m->h, L->shared_gate.data, L->shared_up.data,
                      L->shared_gate.dtype, rows, si, c->hidden);
    be->matmul(be, m->shared_out, be->act_dtype, m->gate, L->shared_down.data,
               L->shared_down.dtype, rows, c->hidden, si);
    be->matmul(be, m->shared_logit, be->act_dtype, m->h, L->shared_expert_gate.data,
               L->shared_expert_gate.dtype, rows, 1, c->hidden);
    be->mul_sigmoid(be, m->shared_out, m->shared_logit, rows, c->hidden, 1, 1);
    be->add(be, m->pend, m->shared_out, rows, c->hidden);
}

/* The gated DeltaNet block of the normed rows (h) into m->att [rows]
 * [v_heads * v_dim]: the projections, the causal conv and the delta rule
 * with the streams' states (their slots), the gated norm. */
static void linear_block(worker_model *m, const model_layer *L, const kernels_batch *batch,
                         int rows)
{
    kernels_backend *be = m->be;
    const model_config *c = &m->cfg;
    size_t a = kernels_act_bytes(be), r = (size_t)rows;
    int cd = model_config_lin_conv_dim(c), nv = c->lin_v_heads, vd = nv * c->lin_v_dim;
    /* the scratch: [rows][cd + 2 nv] of the projections, [rows][cd] of the
     * conv, [rows][vd] of z. Joined weights write rows of [q k v | b | a];
     * else [q k v] rows, then b's rows, then a's, each packed. */
    int ps = cd + 2 * nv;
    unsigned char *proj = m->lin_scratch, *conv = proj + r * (size_t)ps * a,
                  *z = conv + r * (size_t)cd * a, *b, *av;
    int in_stride, ba_stride;
    if (L->lin_joined) {
        be->matmul(be, proj, be->act_dtype, m->h, L->lin_qkv.data, L->lin_qkv.dtype, rows, ps,
                   c->hidden);
        b = proj + (size_t)cd * a;
        av = b + (size_t)nv * a;
        in_stride = ba_stride = ps;
    } else {
        b = proj + r * (size_t)cd * a;
        av = b + r * (size_t)nv * a;
        in_stride = cd;
        ba_stride = nv;
        be->matmul(be, proj, be->act_dtype, m->h, L->lin_qkv.data, L->lin_qkv.dtype, rows, cd,
                   c->hidden);
        be->matmul(be, b, be->act_dtype, m->h, L->lin_b.data, L->lin_b.dtype, rows, nv,
                   c->hidden);
        be->matmul(be, av, be->act_dtype, m->h, L->lin_a.data, L->lin_a.dtype, rows, nv,
                   c->hidden);
    }
    be->matmul(be, z, be->act_dtype, m->h, L->lin_z.data, L->lin_z.dtype, rows, vd, c->hidden);
    unsigned char *state = (unsigned char *)m->states +
                           (size_t)L->state_layer * model_cache_state_bytes(c);
    be->deltanet_conv(be, conv, proj, in_stride, L->lin_conv, cd, c->lin_conv, state,
                      m->slot_bytes, m->slots, batch);
    be->deltanet_rule(be, m->att, conv, b, av, ba_stride, L->lin_decay, L->lin_dt_bias,
                      c->lin_k_heads, nv, c->lin_k_dim, c->lin_v_dim,
                      state + model_cache_conv_bytes(c), m->slot_bytes, m->slots, batch);
    be->rmsnorm_gated(be, m->att, m->att, z, L->lin_norm, rows, nv, c->lin_v_dim, c->rms_eps);
}

/* The attention block of the normed rows (h, or x with the norm inside
 * the matmuls when fused) into m->att [rows][heads * head_dim]: q, k and
 * v, rope, the KV write into the pages of page layer pl and attention;
 * with attn_output_gate, the output scaled by sigmoid(gate). */
static void attention_block(worker_model *m, const model_layer *L, int pl,
                            const kernels_batch *batch, bool fused, int rows)
{
    kernels_backend *be = m->be;
    const model_config *c = &m->cfg;
    int q_w = c->heads * c->head_dim, kv_w = c->kv_heads * c->head_dim;
    size_t a = kernels_act_bytes(be), q_row_bytes = (size_t)q_w * a;
    float scale = 1.0f / sqrtf((float)c->head_dim);
    /* q, k and v as one matmul of joined weights need room for the rows
     * of [q | k | v] in the up buffer (free until the MLP) */
    int qkv_w = q_w + 2 * kv_w;
    bool qkv_room = (size_t)m->opt.max_rows * (size_t)c->intermediate >= (size_t)rows * qkv_w;
    void *q = m->q, *k = m->k, *v = m->v;
    int qkv_stride = 0;
    if (L->q_gate.data)
        normed_matmul(m, fused, m->att_gate, &L->q_gate, rows, q_w);
    if (L->qkv_joined && qkv_room) {
        /* rows of [q | k | v], one GEMM instead of three smaller ones */
        q = m->up;
        k = (unsigned char *)q + (size_t)q_w * a;
        v = (unsigned char *)k + (size_t)kv_w * a;
        qkv_stride = qkv_w;
        normed_matmul(m, fused, q, &L->q, rows, qkv_w);
    } else {
        normed_matmul(m, fused, q, &L->q, rows, q_w);
        normed_matmul(m, fused, k, &L->k, rows, kv_w);
        normed_matmul(m, fused, v, &L->v, rows, kv_w);
    }
    if (m->segs == 1 && m->seg_single[0] && !m->seg_prompt[0] && be->attention_rope_kv) {
        /* a decode round of one row a stream: rope, the KV write and
         * attention as one op (kernels_backend.h) */
        kernels_batch db = *batch;
        db.one_row_per_stream = true;
        be->attention_rope_kv(be, m->att, m->q, q, k, v, qkv_stride, c->heads, L->q_norm,
                              L->k_norm, c->rms_eps, m->inv_freq, m->arena, &m->kv, &db, pl,
                              scale);
    } else {
        /* q normed and rotated into m->q (packed, for attention), k in
         * place, k and v into the pages */
        be->qk_norm_rope_kv_write(be, m->q, q, k, v, qkv_stride, c->heads, L->q_norm, L->k_norm,
                                  c->rms_eps, m->inv_freq, m->arena, &m->kv, batch, pl);
        /* the segments' row tables shift with their rows; the page
         * table, indexed by stream, does not */
        for (int s = 0; s < m->segs; s++) {
            kernels_batch sb = *batch;
            int r0 = m->seg_row0[s];
            sb.rows = m->seg_rows[s];
            sb.row_stream = m->row_stream + r0;
            sb.positions = m->positions + r0;
            sb.one_row_per_stream = m->seg_single[s];
            (m->seg_prompt[s] ? be->attention_prompt : be->attention)(
                be, (unsigned char *)m->att + (size_t)r0 * q_row_bytes,
                (const unsigned char *)m->q + (size_t)r0 * q_row_bytes, c->heads, m->arena,
                &m->kv, &sb, pl, scale);
        }
    }
    if (L->q_gate.data)
        be->mul_sigmoid(be, m->att, m->att_gate, rows, q_w, q_w, q_w);
}

/* Enqueues the pass's ops (and, for a step, the sampling); the logits of
 * the wanted rows stay in m->logits, sampled tokens in m->results. */
static void model_ops(worker_model *m, const worker_forward *f, int stride, run_kind kind)
{
    kernels_backend *be = m->be;
    const model_config *c = &m->cfg;
    int rows = f->rows;
    int q_w = c->heads * c->head_dim;
    kernels_batch batch = {
        .rows = rows,
        .streams = f->streams,
        .page_table_stride = stride,
        .row_stream = m->row_stream,
        .positions = m->positions,
        .page_table = m->page_table,
    };

    be->embed(be, m->x, m->embed.data, m->embed.dtype, m->ids, rows, c->hidden);
    const void *pending = NULL; /* the last block's output, still to add to x */
    bool normed = false;        /* h holds the next norm already (matmul_add_norm) */
    size_t a = kernels_act_bytes(be);
    /* gate and up as one matmul needs room for both outputs of the row */
    bool one_row = rows == 1, gate_up_room = m->opt.max_rows >= 2;
    /* each RMSNorm inside the matmul after it, each residual add inside
     * the matmul before it (fold_norms): no norm pass in the layers */
    bool fused = m->norm_fused && rows <= be->fused_norm_rows;
    for (int l = 0; l < c->layers; l++) {
        const model_layer *L = &m->layers[l];
        if (!fused && !normed)
            be->rmsnorm(be, m->h, m->x, pending, L->attn_norm, rows, c->hidden, c->rms_eps);
        /* the mixer's output (m->att) goes through o, of o_k columns */
        const model_matrix *o = &L->o;
        int o_k = q_w;
        if (L->linear) {
            linear_block(m, L, &batch, rows);
            o = &L->lin_out;
            o_k = c->lin_v_heads * c->lin_v_dim;
        } else {
            attention_block(m, L, m->cache.page_layer[l], &batch, fused, rows);
        }
        if (fused) {
            be->matmul_add(be, m->x, m->att, L->o.data, L->o.dtype, rows, c->hidden, q_w);
            be->matmul_swiglu_rms(be, m->gate, m->x, L->gate.data, L->up.data, L->gate.dtype, rows,
                                  c->intermediate, c->hidden, c->rms_eps);
            be->matmul_add(be, m->x, m->gate, L->down.data, L->down.dtype, rows, c->hidden,
                           c->intermediate);
            continue;
        }
        if (!matmul_add_norm(m, m->att, o, L->mlp_norm, rows, o_k))
            be->rmsnorm(be, m->h, m->x, m->pend, L->mlp_norm, rows, c->hidden, c->rms_eps);
        if (L->moe) {
            moe_block(m, L, l, rows);
            normed = false;
            pending = m->pend;
            continue;
        }
        if (L->gate.dtype == L->up.dtype) {
            /* one row of joined weights: [gate | up] in the gate buffer,
             * which the backend may take as one matmul (or as a GEMV that
             * writes the product alone) */
            void *up = one_row && L->gate_up_joined && gate_up_room
                           ? (unsigned char *)m->gate + (size_t)c->intermediate * a
                           : m->up;
            be->matmul_swiglu(be, m->gate, up, m->h, L->gate.data, L->up.data, L->gate.dtype, rows,
                              c->intermediate, c->hidden);
        } else {
            be->matmul(be, m->gate, be->act_dtype, m->h, L->gate.data, L->gate.dtype, rows,
                       c->intermediate, c->hidden);
            be->matmul(be, m->up, be->act_dtype, m->h, L->up.data, L->up.dtype, rows,
                       c->intermediate, c->hidden);
            be->swiglu(be, m->gate, m->gate, m->up, rows, c->intermediate);
        }
        /* the next layer's norm, or the final one (unused by a pass that
         * wants no logits) */
        const float *next = l + 1 < c->layers ? m->layers[l + 1].attn_norm : m->final_norm;
        normed = matmul_add_norm(m, m->gate, &L->down, next, rows, c->intermediate);
        pending = normed ? NULL : m->pend;
    }
    if (f->logit_count == 0)
        return;
    /* Only the rows whose logits are wanted go through the vocabulary
     * projection, the largest matmul of a decode step. */
    if (!normed)
        be->rmsnorm(be, m->h, m->x, pending, m->final_norm, rows, c->hidden, c->rms_eps);
    /* every row's logits in row order (a decode round): the normed rows
     * are the head's input as they stand, no gather pass */
    const void *sel = m->h;
    if (!logits_of_every_row(f)) {
        be->gather(be, m->sel, m->h, m->logit_rows, f->logit_count, c->hidden);
        sel = m->sel;
    }
    be->matmul(be, m->logits, SHOAL_DTYPE_F32, sel, m->lm_head.data, m->lm_head.dtype,
               f->logit_count, c->vocab, c->hidden);
    if (kind == RUN_FORWARD)
        return;
    bool pen = kind == RUN_STEP_PENALTIES;
    be->sample(be, m->results, m->logits, f->logit_count, c->vocab, m->params,
               pen ? m->pen_offsets : NULL, pen ? m->pen_tokens : NULL, pen ? m->pen_counts : NULL);
}

/* Runs the pass (and for a step the sampling) after checking and staging
 * its inputs. A decode round (every row sampled, one row a stream, no
 * prompt chunk) of a backend with graphs is recorded the first time its
 * (kind, rows) comes and replayed from then on: one launch instead of
 * some fifteen a layer. One row a stream is part of the recording (its
 * attention may read the KV early), so rounds without it run op by op. */
static shoal_err model_run(worker_model *m, const worker_forward *f,
                           const kernels_sample_params *params, const worker_penalties *pen,
                           run_kind kind, shoal_diag *diag)
{
    shoal_err err = check_forward(m, f, diag);
    if (err)
        return err;
    kernels_backend *be = m->be;
    plan_attention(m, f);
    /* every row's logits in order is part of the recording too (no gather) */
    bool graph = logits_of_every_row(f) && f->rows <= m->graph_rows && m->segs == 1 &&
                 !m->seg_prompt[0] && m->seg_single[0];
    int stride = graph ? m->opt.max_pages_per_stream : f->page_table_stride;
    if ((err = stage_step(m, f, kind == RUN_FORWARD ? NULL : params, stride)))
        return shoal_diag_set(diag, err, "forward: cannot upload the batch");
    if (pen &&
        ((err = be->upload(be, m->pen_offsets, pen->offsets, (size_t)(f->logit_count + 1) * 4)) ||
         (err = be->upload(be, m->pen_tokens, pen->tokens, (size_t)pen->entries * 4)) ||
         (err = be->upload(be, m->pen_counts, pen->counts, (size_t)pen->entries * 4))))
        return shoal_diag_set(diag, err, "step: cannot upload penalties");
    if (!graph) {
        model_ops(m, f, stride, kind);
        return f->logit_count == 0 ? be->sync(be) : SHOAL_OK;
    }
    int slot = (int)kind * m->graph_rows + f->rows - 1;
    if (!m->graph_ready[slot]) {
        err = be->graph_begin(be);
        if (err == SHOAL_ERR_UNSUPPORTED) { /* turned off: run, and never ask again */
            m->graph_rows = 0;
            model_ops(m, f, stride, kind);
            return SHOAL_OK;
        }
        if (!err) {
            model_ops(m, f, stride, kind);
            err = be->graph_end(be, slot);
        }
        if (err)
            return shoal_diag_set(diag, err, "forward: cannot record the decode round");
        m->graph_ready[slot] = true;
    }
    if ((err = be->graph_launch(be, slot)))
        return shoal_diag_set(diag, err, "forward: cannot launch the decode round");
    return SHOAL_OK;
}

shoal_err worker_model_forward(worker_model *m, const worker_forward *f, float *logits,
                               shoal_diag *diag)
{
    shoal_err err = model_run(m, f, NULL, NULL, RUN_FORWARD, diag);
    if (err || f->logit_count == 0)
        return err;
    err = m->be->download(m->be, logits, m->logits,
                          (size_t)f->logit_count * (size_t)m->cfg.vocab * 4);
    return err ? shoal_diag_set(diag, err, "forward: cannot download logits") : SHOAL_OK;
}

shoal_err worker_model_step(worker_model *m, const worker_forward *f,
                            const kernels_sample_params *params, const worker_penalties *pen,
                            kernels_sample_result *results, shoal_diag *diag)
{
    kernels_backend *be = m->be;
    int rows = f->logit_count;
    if (pen && (pen->entries < 0 || pen->entries > m->pen_cap))
        return shoal_diag_set(diag, SHOAL_ERR_LIMIT, "step: %d penalty entries, the limit is %d",
                              pen ? pen->entries : 0, m->pen_cap);
    shoal_err err = model_run(m, f, params, rows > 0 ? pen : NULL,
                              rows == 0 ? RUN_FORWARD
                              : pen     ? RUN_STEP_PENALTIES
                                        : RUN_STEP,
                              diag);
    if (err || rows == 0)
        return err;
    err = be->download(be, results, m->results, (size_t)rows * sizeof *results);
    return err ? shoal_diag_set(diag, err, "step: cannot download sampled tokens") : SHOAL_OK;
}

shoal_err worker_model_routing(worker_model *m, int layer, int rows, int32_t *ids, shoal_diag *diag)
{
    const model_config *c = &m->cfg;
    if (layer < 0 || layer >= c->layers || !m->layers[layer].moe || rows < 1 ||
        rows > m->opt.max_rows)
        return shoal_diag_set(diag, SHOAL_ERR_INVALID,
                              "routing: layer %d is no mixture-of-experts layer, or %d rows are "
                              "more than a pass has",
                              layer, rows);
    size_t k = (size_t)c->experts_per_tok;
    shoal_err err = m->be->download(m->be, ids, m->route_ids + (size_t)layer * m->opt.max_rows * k,
                                    (size_t)rows * k * 4);
    return err ? shoal_diag_set(diag, err, "routing: cannot download it") : SHOAL_OK;
}
