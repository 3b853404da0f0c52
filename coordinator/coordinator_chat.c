#include "coordinator_chat.h"

#include "common/common_file.h"
#include "coordinator_limits.h"
#include "coordinator_utf8.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct coordinator_chat {
    coordinator_chat_format format;
    char *bos_token; /* NULL if the model has none */
    char *eos_token;
};

/* The templates shoal renders, by fingerprint. To add one: render it in C
 * below, and add conversations to tests/text/chats.json, which the test
 * checks against the Jinja reference. */
static const struct known_template {
    uint64_t fingerprint;
    size_t bytes;
    coordinator_chat_format format;
    const char *origin;
} known[] = {
    {0x2bfdb7aa9754484eull, 4116, COORDINATOR_CHAT_QWEN3, "Qwen3 (hybrid thinking)"},
    {0x0e60067a5537498eull, 389, COORDINATOR_CHAT_LLAMA3, "Meta Llama-3 Instruct"},
    {0x74891e390e614ae2ull, 348, COORDINATOR_CHAT_LLAMA3_ALWAYS,
     "Llama-3, generation prompt always"},
};

uint64_t coordinator_chat_fingerprint(const char *template_text, size_t bytes)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < bytes; i++)
        h = (h ^ (unsigned char)template_text[i]) * 0x100000001b3ull;
    return h;
}

const char *coordinator_chat_format_name(coordinator_chat_format format)
{
    switch (format) {
    case COORDINATOR_CHAT_QWEN3:
        return "qwen3";
    case COORDINATOR_CHAT_LLAMA3:
        return "llama3";
    case COORDINATOR_CHAT_LLAMA3_ALWAYS:
        return "llama3-always";
    }
    return "?";
}

coordinator_chat_format coordinator_chat_format_of(const coordinator_chat *chat)
{
    return chat->format;
}

/* ---- opening ---- */

shoal_err coordinator_chat_from_template(const char *template_text, size_t bytes,
                                         const char *bos_token, const char *eos_token,
                                         coordinator_chat **out, shoal_diag *diag)
{
    *out = NULL;
    if (bytes > COORDINATOR_CHAT_TEMPLATE_BYTES_MAX)
        return shoal_diag_set(diag, SHOAL_ERR_LIMIT,
                              "chat template of %zu bytes, over the limit of %u", bytes,
                              COORDINATOR_CHAT_TEMPLATE_BYTES_MAX);
    uint64_t fp = coordinator_chat_fingerprint(template_text, bytes);
    const struct known_template *k = NULL;
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
        if (known[i].fingerprint == fp && known[i].bytes == bytes)
            k = &known[i];
    if (!k)
        return shoal_diag_set(diag, SHOAL_ERR_UNSUPPORTED,
                              "unknown chat template (%zu bytes, fingerprint %016llx): shoal "
                              "renders only the Qwen3 and Llama-3 templates it knows, exactly; "
                              "it does not run arbitrary Jinja",
                              bytes, (unsigned long long)fp);
    if (k->format != COORDINATOR_CHAT_QWEN3 && !bos_token)
        return shoal_diag_set(diag, SHOAL_ERR_FORMAT,
                              "the %s chat template needs a bos_token, and the config has none",
                              k->origin);
    coordinator_chat *chat = calloc(1, sizeof *chat);
    if (!chat)
        return shoal_diag_set(diag, SHOAL_ERR_NOMEM, "no memory");
    chat->format = k->format;
    chat->bos_token = bos_token ? strdup(bos_token) : NULL;
    chat->eos_token = eos_token ? strdup(eos_token) : NULL;
    if ((bos_token && !chat->bos_token) || (eos_token && !chat->eos_token)) {
        coordinator_chat_close(chat);
        return shoal_diag_set(diag, SHOAL_ERR_NOMEM, "no memory");
    }
    *out = chat;
    return SHOAL_OK;
}

/* bos_token / eos_token: a string, an AddedToken object, or null. */
static const char *token_string(const cJSON *v)
{
    if (cJSON_IsString(v))
        return v->valuestring;
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(v, "content");
    return cJSON_IsString(c) ? c->valuestring : NULL;
}

shoal_err coordinator_chat_parse(const char *json, size_t bytes, const char *label,
                                 coordinator_chat **out, shoal_diag *diag)
{
    shoal_err err;
    *out = NULL;
    cJSON *root = cJSON_ParseWithLength(json, bytes);
    if (!cJSON_IsObject(root)) {
        err = shoal_diag_set(diag, SHOAL_ERR_FORMAT, "%s: not a JSON object (truncated file?)",
                             label);
        goto out;
    }
    const cJSON *tpl = cJSON_GetObjectItemCaseSensitive(root, "chat_template");
    if (cJSON_IsArray(tpl)) {
        /* A list of named templates: transformers uses "default". */
        const cJSON *e, *found = NULL;
        cJSON_ArrayForEach(e, tpl)
        {
            const cJSON *name = cJSON_GetObjectItemCaseSensitive(e, "name");
            if (cJSON_IsString(name) && strcmp(name->valuestring, "default") == 0)
                found = cJSON_GetObjectItemCaseSensitive(e, "template");
        }
        tpl = found;
    }
    if (!cJSON_IsString(tpl)) {
        err = shoal_diag_set(diag, SHOAL_ERR_FORMAT, "%s: no chat_template string", label);
        goto out;
    }
    err = coordinator_chat_from_template(
        tpl->valuestring, strlen(tpl->valuestring),
        token_string(cJSON_GetObjectItemCaseSensitive(root, "bos_token")),
        token_string(cJSON_GetObjectItemCaseSensitive(root, "eos_token")), out, diag);
    if (err != SHOAL_OK && diag) {
        char msg[SHOAL_DIAG_BYTES];
        snprintf(msg, sizeof msg, "%s", diag->msg);
        shoal_diag_set(diag, err, "%s: %s", label, msg);
    }
out:
    cJSON_Delete(root);
    return err;
}

shoal_err coordinator_chat_open(const char *tokenizer_config_path, coordinator_chat **out,
                                shoal_diag *diag)
{
    char *json;
    size_t bytes;
    *out = NULL;
    shoal_err err = common_file_read(tokenizer_config_path, COORDINATOR_TOKENIZER_FILE_BYTES_MAX,
                                     &json, &bytes, diag);
    if (err != SHOAL_OK)
        return err;
    err = coordinator_chat_parse(json, bytes, tokenizer_config_path, out, diag);
    free(json);
    return err;
}

void coordinator_chat_close(coordinator_chat *chat)
{
    if (!chat)
        return;
    free(chat->bos_token);
    free(chat->eos_token);
    free(chat);
}

/* ---- rendering ---- */

/* Text of the rendering: len counts everything, only cap bytes are kept. */
typedef struct writer {
    char *buf;
    size_t cap;
    size_t len;
} writer;

static void put(writer *w, const char *s, size_t n)
{
    if (w->len < w->cap) {
        size_t room = w->cap - w->len;
        memcpy(w->buf + w->len, s, n < room ? n : room);
    }
    w->len += n;
}

static void puts_(writer *w, const char *s)
{
    put(w, s, strlen(s));
}

/* A piece of a string: Python's str methods as the templates use them. */
typedef struct view {
    const char *s;
    size_t n;
} view;

static view view_of(const char *s)
{
    return (view){s, strlen(s)};
}

static void put_view(writer *w, view v)
{
    put(w, v.s, v.n);
}

static view lstrip_nl(view v)
{
    while (v.n > 0 && v.s[0] == '\n') {
        v.s++;
        v.n--;
    }
    return v;
}

static view rstrip_nl(view v)
{
    while (v.n > 0 && v.s[v.n - 1] == '\n')
        v.n--;
    return v;
}

static const char *find_first(view v, const char *needle)
{
    size_t k = strlen(needle);
    for (size_t i = 0; i + k <= v.n; i++)
        if (memcmp(v.s + i, needle, k) == 0)
            return v.s + i;
    return NULL;
}

static const char *find_last(view v, const char *needle)
{
    size_t k = strlen(needle);
    for (size_t i = v.n >= k ? v.n - k + 1 : 0; i-- > 0;)
        if (memcmp(v.s + i, needle, k) == 0)
            return v.s + i;
    return NULL;
}

/* s.split(sep)[-1] */
static view after_last(view v, const char *sep)
{
    const char *p = find_last(v, sep);
    if (!p)
        return v;
    p += strlen(sep);
    return (view){p, (size_t)(v.s + v.n - p)};
}

/* s.split(sep)[0] */
static view before_first(view v, const char *sep)
{
    const char *p = find_first(v, sep);
    return p ? (view){v.s, (size_t)(p - v.s)} : v;
}

static bool starts_with(view v, const char *p)
{
    size_t k = strlen(p);
    return v.n >= k && memcmp(v.s, p, k) == 0;
}

static bool ends_with(view v, const char *p)
{
    size_t k = strlen(p);
    return v.n >= k && memcmp(v.s + v.n - k, p, k) == 0;
}

/* Python's str.isspace() for one code point (what Jinja's trim strips). */
static bool py_space(unsigned cp)
{
    return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 ||
           cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 ||
           cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

/* Jinja's |trim: Python's str.strip(). */
static view py_strip(view v)
{
    const unsigned char *s = (const unsigned char *)v.s;
    size_t a = 0, b = v.n;
    while (a < b) {
        coordinator_utf8_kind kind;
        unsigned cp;
        size_t len = coordinator_utf8_next(s + a, b - a, &kind, &cp);
        if (kind != COORDINATOR_UTF8_CHAR || !py_space(cp))
            break;
        a += len;
    }
    while (b > a) {
        /* Step back to the start of the last character. */
        size_t start = b - 1;
        while (start > a && (s[start] & 0xC0) == 0x80 && b - start < 4)
            start--;
        coordinator_utf8_kind kind;
        unsigned cp;
        size_t len = coordinator_utf8_next(s + start, b - start, &kind, &cp);
        if (kind != COORDINATOR_UTF8_CHAR || start + len != b || !py_space(cp))
            break;
        b = start;
    }
    return (view){v.s + a, b - a};
}

static bool role_is(const coordinator_chat_message *m, const char *role)
{
    return strcmp(m->role, role) == 0;
}

/* ---- Jinja's tojson, as @huggingface/jinja writes it ---- */

/* A string as JSON.stringify writes it (Python's json.dumps with
 * ensure_ascii=False escapes the same characters the same way). */
static void put_json_string(writer *w, const char *s)
{
    static const char hex[] = "0123456789abcdef";
    puts_(w, "\"");
    for (const char *run = s;; s++) {
        unsigned char c = (unsigned char)*s;
        if (c != 0 && c >= 0x20 && c != '"' && c != '\\')
            continue;
        put(w, run, (size_t)(s - run));
        if (c == 0)
            break;
        /* '"' and '\\' as themselves, five controls by letter, the rest
         * as \u00xx */
        static const char controls[] = "\b\f\n\r\t", letters[] = "bfnrt";
        const char *ctl = c >= 0x20 ? NULL : memchr(controls, c, sizeof controls - 1);
        char esc[6] = {'\\', (char)c, '0', '0', hex[c >> 4], hex[c & 15]};
        size_t len = c >= 0x20 || ctl ? 2 : 6;
        if (ctl)
            esc[1] = letters[ctl - controls];
        else if (c < 0x20)
            esc[1] = 'u';
        put(w, esc, len);
        run = s + 1;
    }
    puts_(w, "\"");
}

/* A double as JavaScript's Number.prototype.toString writes it (ECMA-262
 * Number::toString): the fewest digits that read back as the same double,
 * positional from 1e-6 up to 1e21, exponent form outside. JSON.stringify
 * writes a non-finite number (1e999 parsed) as null. */
static void put_json_number(writer *w, double v)
{
    if (!isfinite(v)) {
        puts_(w, "null");
        return;
    }
    if (v == 0) {
        puts_(w, "0"); /* -0 too */
        return;
    }
    char sci[40];
    for (int p = 1; p <= 17; p++) {
        snprintf(sci, sizeof sci, "%.*e", p - 1, v);
        if (strtod(sci, NULL) == v)
            break;
    }
    /* sci is [-]d[.ddd]e(+|-)xx: its digits, and n with v = 0.digits * 10^n */
    char digits[24];
    int k = 0;
    const char *c = sci;
    if (*c == '-') {
        puts_(w, "-");
        c++;
    }
    for (; *c != 'e'; c++)
        if (*c != '.')
            digits[k++] = *c;
    while (k > 1 && digits[k - 1] == '0')
        k--;
    int n = atoi(c + 1) + 1;
    if (k <= n && n <= 21) {
        put(w, digits, (size_t)k);
        for (int i = k; i < n; i++)
            puts_(w, "0");
    } else if (0 < n && n <= 21) {
        put(w, digits, (size_t)n);
        puts_(w, ".");
        put(w, digits + n, (size_t)(k - n));
    } else if (-6 < n && n <= 0) {
        puts_(w, "0.");
        for (int i = n; i < 0; i++)
            puts_(w, "0");
        put(w, digits, (size_t)k);
    } else {
        char exp[16];
        put(w, digits, 1);
        if (k > 1) {
            puts_(w, ".");
            put(w, digits + 1, (size_t)(k - 1));
        }
        snprintf(exp, sizeof exp, "e%c%d", n - 1 < 0 ? '-' : '+', abs(n - 1));
        puts_(w, exp);
    }
}

/* `v | tojson`: no indent, separators ", " and ": ", keys in order. The
 * depth is cJSON's parse bound (CJSON_NESTING_LIMIT), so the recursion is
 * bounded by what a request can hold. */
static void put_tojson(writer *w, const cJSON *v)
{
    if (cJSON_IsString(v)) {
        put_json_string(w, v->valuestring);
    } else if (cJSON_IsNumber(v)) {
        put_json_number(w, v->valuedouble);
    } else if (cJSON_IsTrue(v)) {
        puts_(w, "true");
    } else if (cJSON_IsFalse(v)) {
        puts_(w, "false");
    } else if (cJSON_IsArray(v) || cJSON_IsObject(v)) {
        bool object = cJSON_IsObject(v);
        puts_(w, object ? "{" : "[");
        for (const cJSON *e = v->child; e; e = e->next) {
            if (e != v->child)
                puts_(w, ", ");
            if (object) {
                put_json_string(w, e->string);
                puts_(w, ": ");
            }
            put_tojson(w, e);
        }
        puts_(w, object ? "}" : "]");
    } else if (cJSON_IsRaw(v)) {
        puts_(w, v->valuestring); /* already JSON text */
    } else {
        puts_(w, "null");
    }
}

/* Jinja's truth of `tools`: a non-empty list. */
static bool has_tools(const coordinator_chat_options *opt)
{
    return opt->tools && cJSON_GetArraySize(opt->tools) > 0;
}

static void render_qwen3_tools(const coordinator_chat_message *msgs,
                               const coordinator_chat_options *opt, writer *w)
{
    puts_(w, "<|im_start|>system\n");
    if (role_is(&msgs[0], "system")) {
        puts_(w, msgs[0].content);
        puts_(w, "\n\n");
    }
    puts_(w, "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
             "You are provided with function signatures within <tools></tools> XML tags:\n"
             "<tools>");
    for (const cJSON *tool = opt->tools->child; tool; tool = tool->next) {
        puts_(w, "\n");
        put_tojson(w, tool);
    }
    puts_(w, "\n</tools>\n\nFor each function call, return a json object with function name "
             "and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
             "{\"name\": <function-name>, \"arguments\": <args-json-object>}\n"
             "</tool_call><|im_end|>\n");
}

/* An assistant turn's tool calls; content is the template's `content`
 * (after its <think> split), whose truth decides the first newline. */
static void render_qwen3_tool_calls(const coordinator_chat_message *m, view content, writer *w)
{
    for (size_t j = 0; j < m->tool_call_count; j++) {
        const coordinator_chat_tool_call *tc = &m->tool_calls[j];
        if (j > 0 || content.n > 0)
            puts_(w, "\n");
        puts_(w, "<tool_call>\n{\"name\": \"");
        puts_(w, tc->name);
        puts_(w, "\", \"arguments\": ");
        if (!tc->arguments_value)
            puts_(w, tc->arguments);
        else if (cJSON_IsString(tc->arguments_value))
            puts_(w, tc->arguments_value->valuestring);
        else
            put_tojson(w, tc->arguments_value);
        puts_(w, "}\n</tool_call>");
    }
}

static void render_qwen3(const coordinator_chat_message *msgs, size_t n,
                         const coordinator_chat_options *opt, writer *w)
{
    if (has_tools(opt)) {
        render_qwen3_tools(msgs, opt, w);
    } else if (role_is(&msgs[0], "system")) {
        puts_(w, "<|im_start|>system\n");
        puts_(w, msgs[0].content);
        puts_(w, "<|im_end|>\n");
    }
    /* The last user turn that is not a bare tool result: assistant turns
     * after it keep their reasoning. */
    size_t last_query = n - 1;
    for (size_t i = n; i-- > 0;) {
        view c = view_of(msgs[i].content);
        if (role_is(&msgs[i], "user") &&
            !(starts_with(c, "<tool_response>") && ends_with(c, "</tool_response>"))) {
            last_query = i;
            break;
        }
    }
    for (size_t i = 0; i < n; i++) {
        const coordinator_chat_message *m = &msgs[i];
        bool last = i + 1 == n;
        if (role_is(m, "user") || (role_is(m, "system") && i > 0)) {
            puts_(w, "<|im_start|>");
            puts_(w, m->role);
            puts_(w, "\n");
            puts_(w, m->content);
            puts_(w, "<|im_end|>\n");
        } else if (role_is(m, "assistant")) {
            view content = view_of(m->content);
            view reasoning = {"", 0};
            if (m->reasoning_content) {
                reasoning = view_of(m->reasoning_content);
            } else if (find_first(content, "</think>")) {
                view all = content;
                content = lstrip_nl(after_last(all, "</think>"));
                reasoning =
                    lstrip_nl(after_last(rstrip_nl(before_first(all, "</think>")), "<think>"));
            }
            puts_(w, "<|im_start|>assistant\n");
            if (i > last_query && (last || reasoning.n > 0)) {
                puts_(w, "<think>\n");
                put_view(w, rstrip_nl(lstrip_nl(reasoning)));
                puts_(w, "\n</think>\n\n");
                put_view(w, lstrip_nl(content));
            } else {
                put_view(w, content);
            }
            render_qwen3_tool_calls(m, content, w);
            puts_(w, "<|im_end|>\n");
        } else if (role_is(m, "tool")) {
            if (i == 0 || !role_is(&msgs[i - 1], "tool"))
                puts_(w, "<|im_start|>user");
            puts_(w, "\n<tool_response>\n");
            puts_(w, m->content);
            puts_(w, "\n</tool_response>");
            if (last || !role_is(&msgs[i + 1], "tool"))
                puts_(w, "<|im_end|>\n");
        }
    }
    if (opt->add_generation_prompt) {
        puts_(w, "<|im_start|>assistant\n");
        if (opt->thinking == COORDINATOR_CHAT_THINKING_OFF)
            puts_(w, "<think>\n\n</think>\n\n");
    }
}

static void render_llama3(const coordinator_chat *chat, const coordinator_chat_message *msgs,
                          size_t n, const coordinator_chat_options *opt, writer *w)
{
    for (size_t i = 0; i < n; i++) {
        if (i == 0)
            puts_(w, chat->bos_token);
        puts_(w, "<|start_header_id|>");
        puts_(w, msgs[i].role);
        puts_(w, "<|end_header_id|>\n\n");
        put_view(w, py_strip(view_of(msgs[i].content)));
        puts_(w, "<|eot_id|>");
    }
    if (opt->add_generation_prompt || chat->format == COORDINATOR_CHAT_LLAMA3_ALWAYS)
        puts_(w, "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

shoal_err coordinator_chat_render(const coordinator_chat *chat,
                                  const coordinator_chat_message *messages, size_t n,
                                  const coordinator_chat_options *options, char *out, size_t cap,
                                  size_t *out_bytes, shoal_diag *diag)
{
    static const char *const roles[] = {"system", "user", "assistant", "tool"};
    *out_bytes = 0;
    if (n == 0)
        return shoal_diag_set(diag, SHOAL_ERR_INVALID, "a conversation needs a message");
    if (n > COORDINATOR_CHAT_MESSAGES_MAX)
        return shoal_diag_set(diag, SHOAL_ERR_LIMIT, "%zu messages, over the limit of %d", n,
                              COORDINATOR_CHAT_MESSAGES_MAX);
    for (size_t i = 0; i < n; i++) {
        bool known_role = false;
        for (size_t r = 0; r < sizeof roles / sizeof roles[0]; r++)
            known_role |= messages[i].role && strcmp(messages[i].role, roles[r]) == 0;
        if (!known_role)
            return shoal_diag_set(diag, SHOAL_ERR_INVALID,
                                  "message %zu: role '%.32s' is not one of system, user, "
                                  "assistant, tool",
                                  i, messages[i].role ? messages[i].role : "(none)");
        if (!messages[i].content)
            return shoal_diag_set(diag, SHOAL_ERR_INVALID, "message %zu has no content", i);
        if (messages[i].tool_call_count > 0 && strcmp(messages[i].role, "assistant") != 0)
            return shoal_diag_set(diag, SHOAL_ERR_INVALID,
                                  "message %zu: only an assistant turn has tool calls", i);
        for (size_t j = 0; j < messages[i].tool_call_count; j++) {
            const coordinator_chat_tool_call *tc = &messages[i].tool_calls[j];
            if (!tc->name || (!tc->arguments && !tc->arguments_value))
                return shoal_diag_set(diag, SHOAL_ERR_INVALID,
                                      "message %zu: tool call %zu has no %s", i, j,
                                      tc->name ? "arguments" : "name");
        }
    }
    if (options->tools && !cJSON_IsArray(options->tools))
        return shoal_diag_set(diag, SHOAL_ERR_INVALID, "tools must be an array");
    writer w = {out, cap, 0};
    if (chat->format == COORDINATOR_CHAT_QWEN3)
        render_qwen3(messages, n, options, &w);
    else
        render_llama3(chat, messages, n, options, &w);
    *out_bytes = w.len;
    if (w.len >= cap)
        return SHOAL_ERR_LIMIT;
    out[w.len] = '\0';
    return SHOAL_OK;
}
