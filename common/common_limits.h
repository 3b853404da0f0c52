/* common_limits.h: every bound of shoal in one place, each with its reason.
 *
 * Input that would pass a bound is refused with SHOAL_ERR_LIMIT and a message
 * that names the bound; nothing grows past these at run time. */
#ifndef SHOAL_COMMON_LIMITS_H
#define SHOAL_COMMON_LIMITS_H

/* A model directory file we read whole (config.json, generation_config.json,
 * model.safetensors.index.json). Real ones are a few KiB to ~100 KiB. */
#define SHOAL_JSON_FILE_BYTES_MAX (16u * 1024u * 1024u)

/* A safetensors JSON header. The Rust safetensors crate refuses headers over
 * 100 MB; real headers of large models are ~1 MB. */
#define SHOAL_SAFETENSORS_HEADER_BYTES_MAX (100u * 1024u * 1024u)

/* Tensors in one safetensors file, and shards in one model: a 70B model has
 * ~700 tensors in ~30 shards. */
#define SHOAL_SAFETENSORS_TENSORS_MAX 65536
#define SHOAL_MODEL_SHARDS_MAX 1024

/* Dimensions of one tensor: transformers weights have at most 4. */
#define SHOAL_TENSOR_DIMS_MAX 8

/* Length of a tensor name; HF names are under 100 characters. */
#define SHOAL_TENSOR_NAME_BYTES_MAX 256

/* Model shape bounds: far above any published model, low enough that size
 * products of them cannot overflow 64 bits. */
#define SHOAL_MODEL_LAYERS_MAX 512
#define SHOAL_MODEL_HIDDEN_MAX 65536
#define SHOAL_MODEL_INTERMEDIATE_MAX 262144
#define SHOAL_MODEL_HEADS_MAX 256
#define SHOAL_MODEL_HEAD_DIM_MAX 512
#define SHOAL_MODEL_CONV_KERNEL_MAX 8 /* a gated DeltaNet layer's causal conv */
#define SHOAL_MODEL_VOCAB_MAX (4 * 1024 * 1024)
#define SHOAL_MODEL_EOS_IDS_MAX 16
/* Experts of a mixture-of-experts layer, and experts a token goes to: the
 * largest of today's checkpoints (Qwen3.5-397B) has 512 experts and 10 a
 * token; the per-row routing tables are sized by the second. */
#define SHOAL_MODEL_EXPERTS_MAX 512
#define SHOAL_MODEL_EXPERTS_PER_TOK_MAX 32

/* Context length of one stream, in tokens (the largest published context
 * windows are 1M tokens). */
#define SHOAL_CONTEXT_TOKENS_MAX (1024 * 1024)

/* Tokens per KV page: a power of two between these. 16 is vLLM's default;
 * above 256 a page wastes too much of its last, partly filled block. */
#define SHOAL_PAGE_TOKENS_MIN 1
#define SHOAL_PAGE_TOKENS_MAX 256

/* Rows (tokens) in one forward pass: bounds the activation buffers, which
 * are sized once at start for this many rows. */
#define SHOAL_BATCH_ROWS_MAX 8192

/* Streams in one forward pass. */
#define SHOAL_BATCH_STREAMS_MAX 512
/* recurrent-state slots a hybrid model keeps (streams and checkpoints) */
#define SHOAL_STATE_SLOTS_MAX 65536

/* Streams waiting for admission in one worker: past this, submit answers
 * "retry later" (the coordinator's 429/503) instead of queueing unbounded. */
#define SHOAL_QUEUED_STREAMS_MAX 65536

/* Threads of the CPU backend's pool. */
#define SHOAL_CPU_THREADS_MAX 256

/* Path lengths we build (model directory + file name). */
#define SHOAL_PATH_BYTES_MAX 4096

/* The state store (store/). */

/* A page record, header included: a 16-token bf16 page of a 405B model is
 * ~8 MiB and of an 8B model ~2.3 MiB; 256-token pages of the largest shapes
 * stay under this. LMDB keeps values below 4 GiB; one value this large is
 * still one contiguous read. */
#define SHOAL_STORE_RECORD_BYTES_MAX (256ull * 1024 * 1024)

/* The writer queue of one store handle: copies of pages waiting to be
 * written, allocated once at open. 256 MiB is ~110 pages of an 8B model
 * (1.7k tokens), about one long turn of spills, or 0.1-0.3 s of NVMe
 * writes: enough to ride out a slow commit, small enough to stay a minor
 * share of host memory. Past it a spill is dropped and counted (the page is
 * recomputed later) rather than stall the engine's step. Slots bound the
 * count for small pages (a bigger queue of tiny pages only delays drops). */
#define SHOAL_STORE_QUEUE_BYTES_MAX (256ull * 1024 * 1024)
#define SHOAL_STORE_QUEUE_SLOTS_MAX 256

/* Last-use updates waiting for the writer (32 bytes each): one restore of a
 * 64k-token conversation at 16 tokens a page. Past it an update is dropped;
 * eviction order is then slightly stale, nothing else. */
#define SHOAL_STORE_TOUCH_QUEUE_MAX 4096

/* Record bytes written in one transaction. Every worker of the cluster
 * shares the environment's single write lock; 64 MiB keeps one batch to
 * tens of milliseconds on NVMe, and far from LMDB's per-transaction limit
 * of dirty pages. */
#define SHOAL_STORE_BATCH_BYTES_MAX (64ull * 1024 * 1024)

/* --spill-gib: 64 TiB is beyond any local disk; it keeps map sizes (a few
 * times the spill bytes) far inside the 47-bit address space. */
#define SHOAL_STORE_SPILL_BYTES_MAX (64ull << 40)

/* Attempts of one write transaction that found the map full: each clears
 * stale readers and grows the map or evicts, so a few suffice; past them the
 * batch is dropped and counted rather than retried forever. */
#define SHOAL_STORE_MAP_FULL_RETRIES 6

/* Blocks walked along one chain (show, list, rm): the longest context at
 * the smallest page. Also stops a walk on a parent loop in a damaged index. */
#define SHOAL_STORE_CHAIN_BLOCKS_MAX (SHOAL_CONTEXT_TOKENS_MAX / SHOAL_PAGE_TOKENS_MIN)

/* Store handles open at once in one process (LMDB allows one environment
 * handle per directory per process; a worker needs one). */
#define SHOAL_STORE_OPEN_MAX 16

/* How long open waits for a running `shoalctl states compact` to swap the
 * environment in before it gives up: a compaction copies at disk speed,
 * about a minute for tens of GiB. */
#define SHOAL_STORE_OPEN_WAIT_MS 60000

/* Arena hand-over (shm/shm_arena.c): how long the exporter's thread waits
 * to hand one connection its 64-byte message before it drops it (a peer
 * that does not read cannot stall the others; a fresh socket takes it at
 * once), and the connections waiting to be accepted (every worker of a
 * cluster at once: SHM_SEGMENT_WORKERS_MAX). */
#define SHOAL_ARENA_SEND_TIMEOUT_MS 1000
#define SHOAL_ARENA_BACKLOG 64

/* How long a worker waits for a peer's arena (shm_arena_fetch, from its
 * step loop: the idle import of a peer that came up, or a prefix import
 * in a step) before it does without (computes the pages itself), and how
 * long it then leaves that peer's arena alone before it asks again. The
 * wait blocks the worker's reports, so it stays well inside
 * SHOAL_REPORT_LATE_MS and the coordinator's heartbeat limit: a peer that
 * is stopped or slow to answer (a debugger, a paused test, swapping) costs
 * its neighbours at most this once a retry period, never their health. A
 * fetch takes about a millisecond when the owner runs. */
#define SHOAL_ARENA_FETCH_TIMEOUT_MS 500
#define SHOAL_ARENA_FETCH_RETRY_MS 2000

/* The bridge between a worker's pages and the store (worker_states). */

/* Host staging of restores: pages read from the store wait here until the
 * engine's next step uploads them, so it must hold what the readers bring
 * in one step (a 2,048-token prefill chunk of an 8B model takes ~55 ms:
 * ~550 MB from the page cache at 10 GB/s, ~80 MB from a 1.5 GB/s disk).
 * 512 MiB (227 pages of an 8B model, pinned) is a minor share of a GPU
 * host's memory; at most SHOAL_STATES_STAGING_PAGES_MAX pages of a small
 * model. */
#define SHOAL_STATES_STAGING_BYTES_MAX (512ull * 1024 * 1024)
#define SHOAL_STATES_STAGING_PAGES_MAX 256

/* How long an engine whose streams only wait for restores waits for a read
 * before it steps again. */
#define SHOAL_STATES_WAIT_MS 2

/* The disk read speed a restore assumes before it has measured one, bytes
 * a second (1.4-2.0 GB/s measured on the H200 hosts; an NVMe drive is
 * faster, and the first reads correct it). A history in the page cache
 * reads at 10-14 GB/s, three times faster than an 8B model computes its
 * KV on an H200, and is read whole. */
#define SHOAL_STATES_DISK_PRIOR_BPS 1.5e9

/* The nice value of reader threads: the engine's thread comes first. */
#define SHOAL_STATES_READER_NICE 10

/* Steps of at least this many rows measure the engine's prefill speed,
 * smaller ones the fixed cost of a step; with both a restore shares a
 * history between computing and reading. */
#define SHOAL_PREFILL_SAMPLE_ROWS 64

/* Reader threads of one worker's restores: each checks a page's SHA-256
 * at ~1.5-2 GB/s, so 8 keep up with a fast NVMe drive. */
#define SHOAL_STATES_READ_THREADS_MAX 64

/* How long a worker writes its learned pages at a clean shutdown before it
 * exits anyway (those left are recomputed after the restart): 60 s is
 * ~100 GiB at NVMe speed, more than --spill-gib usually allows. The
 * coordinator waits this long, plus a margin, before SIGKILL. */
#define SHOAL_STATES_SHUTDOWN_WRITE_MS 60000

/* Operations (shoalctl, drain, systemd). */

/* How long a worker started on its own (shoal-worker@N under systemd)
 * waits for its coordinator to create the cluster's segment, or to replace
 * a killed cluster's: the units start together, and the coordinator reads
 * its tokenizer before it creates the segment. */
#define SHOAL_JOIN_WAIT_MS 30000

/* How long a drained worker has to exit after SHUTDOWN before its
 * coordinator kills it: a learning worker writes its states first, for up
 * to 60 s (SHOAL_STATES_SHUTDOWN_WRITE_MS), and sends no heartbeat meanwhile. */
#define SHOAL_DRAIN_EXIT_MS 65000

/* A worker whose last report is older than this is "not answering" in
 * shoalctl: a worker reports after every step and at least every
 * heartbeat (200 ms), and its coordinator gives up on it at 3 s. */
#define SHOAL_REPORT_LATE_MS 2000

/* How long one engine step may run before its worker is taken for hung
 * (--step-timeout-s): until then a thread heartbeats for the step, past
 * it the worker falls silent and its coordinator restarts it. Five
 * minutes, as SGLang's watchdog: a long prefill chunk on the CPU takes
 * seconds, a hung GPU forever. */
#define SHOAL_STEP_TIMEOUT_S 300

/* Prefixes listed per worker by `shoalctl pages` (largest, most reused). */
#define SHOALCTL_PREFIXES_SHOWN 5

/* Structured outputs (grammar/). A regex's quantifier counts {n,m} stop at
 * 256: a JSON schema's maxLength or maxItems rarely passes it, and each
 * count copies its operand into the NFA. Group nesting stops at 64, which
 * bounds the parser's recursion. The NFA and DFA state bounds are the
 * defaults of grammar_limits: 100,000 DFA states are ~10 MB of transitions
 * at 24 byte classes; a schema-shaped regex needs a few hundred. The token
 * index keeps one bitmask row per DFA state (vocab/8 bytes: 19 KiB for
 * Qwen3's 151,669 ids) plus 8 bytes per allowed (token, next state) pair;
 * 1 GiB holds ~50,000 rows. */
#define SHOAL_GRAMMAR_REPEAT_MAX 256
#define SHOAL_GRAMMAR_DEPTH_MAX 64
#define SHOAL_GRAMMAR_REGEX_BYTES_MAX (64u * 1024u)
#define SHOAL_GRAMMAR_NFA_STATES_MAX 1000000u
#define SHOAL_GRAMMAR_DFA_STATES_MAX 100000u
#define SHOAL_GRAMMAR_INDEX_BYTES_MAX (1024ull * 1024 * 1024)

/* JSON Schema to regex (grammar_schema). Optional properties are an
 * alternation over which are present, and the text before the first one
 * present is copied once per optional property: 8 keeps that copying small.
 * Schemas nest at most 16 deep (each level opens a few regex groups, which
 * stop at SHOAL_GRAMMAR_DEPTH_MAX). Untyped values and response_format
 * json_object nest 3 deep: each level quadruples the regex (objects and
 * arrays both repeat the value below), and depth 3 is ~10 KiB. */
#define SHOAL_GRAMMAR_OPTIONAL_MAX 8
#define SHOAL_GRAMMAR_SCHEMA_DEPTH_MAX 16
#define SHOAL_GRAMMAR_JSON_DEPTH 3

#endif
