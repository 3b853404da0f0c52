/* grammar_regex.c: regex text -> syntax tree -> Thompson NFA over bytes ->
 * DFA by subset construction, pruned to the states that can still match.
 *
 * Classes are sets of code-point ranges until the NFA is built; there each
 * range becomes the UTF-8 byte-range sequences that encode exactly it (the
 * split of Rust's utf8-ranges), so the automata never see a code point. */
#include "grammar/grammar_regex.h"

#include <stdlib.h>
#include <string.h>

#include "common/common_assert.h"
#include "common/common_limits.h"

#define CP_MAX 0x10FFFFu
#define REPEAT_INF UINT32_MAX

void grammar_limits_default(grammar_limits *limits)
{
    limits->nfa_states_max = SHOAL_GRAMMAR_NFA_STATES_MAX;
    limits->dfa_states_max = SHOAL_GRAMMAR_DFA_STATES_MAX;
    limits->index_bytes_max = SHOAL_GRAMMAR_INDEX_BYTES_MAX;
}

/* ---- growable arrays ---------------------------------------------------- */

static bool grow(void **p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return true;
    size_t n = *cap ? *cap : 16;
    while (n < need)
        n *= 2;
    void *q = realloc(*p, n * elem);
    if (!q)
        return false;
    *p = q;
    *cap = n;
    return true;
}

/* ---- code-point sets ---------------------------------------------------- */

typedef struct cp_range {
    uint32_t lo, hi;
} cp_range;

typedef struct cp_set {
    cp_range *r;
    size_t n, cap;
} cp_set;

static bool set_add(cp_set *s, uint32_t lo, uint32_t hi)
{
    if (!grow((void **)&s->r, &s->cap, s->n + 1, sizeof *s->r))
        return false;
    s->r[s->n++] = (cp_range){lo, hi};
    return true;
}

static int range_cmp(const void *a, const void *b)
{
    const cp_range *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

/* Sorts and merges overlapping or adjacent ranges. */
static void set_normalize(cp_set *s)
{
    if (s->n == 0)
        return;
    qsort(s->r, s->n, sizeof *s->r, range_cmp);
    size_t w = 0;
    for (size_t i = 1; i < s->n; i++) {
        if (s->r[i].lo <= s->r[w].hi + 1) {
            if (s->r[i].hi > s->r[w].hi)
                s->r[w].hi = s->r[i].hi;
        } else {
            s->r[++w] = s->r[i];
        }
    }
    s->n = w + 1;
}

/* Replaces s (normalized) with its complement over 0..CP_MAX. */
static bool set_negate(cp_set *s)
{
    cp_set out = {0};
    uint32_t next = 0;
    for (size_t i = 0; i < s->n; i++) {
        if (s->r[i].lo > next && !set_add(&out, next, s->r[i].lo - 1))
            goto out_nomem;
        next = s->r[i].hi + 1;
    }
    if (next <= CP_MAX && !set_add(&out, next, CP_MAX))
        goto out_nomem;
    free(s->r);
    *s = out;
    return true;
out_nomem:
    free(out.r);
    return false;
}

/* Removes the surrogates from s (normalized): no UTF-8 encodes them. */
static bool set_drop_surrogates(cp_set *s)
{
    size_t n = s->n;
    for (size_t i = 0; i < n; i++) {
        cp_range r = s->r[i];
        if (r.hi < 0xD800 || r.lo > 0xDFFF)
            continue;
        if (r.lo < 0xD800 && r.hi > 0xDFFF) {
            s->r[i].hi = 0xD7FF;
            if (!set_add(s, 0xE000, r.hi))
                return false;
        } else if (r.lo < 0xD800) {
            s->r[i].hi = 0xD7FF;
        } else if (r.hi > 0xDFFF) {
            s->r[i].lo = 0xE000;
        } else {
            s->r[i].lo = 1; /* emptied: marked, dropped below */
            s->r[i].hi = 0;
        }
    }
    size_t w = 0;
    for (size_t i = 0; i < s->n; i++)
        if (s->r[i].lo <= s->r[i].hi)
            s->r[w++] = s->r[i];
    s->n = w;
    set_normalize(s);
    return true;
}

/* ---- syntax tree -------------------------------------------------------- */

enum node_kind { NODE_CLASS, NODE_CONCAT, NODE_ALT, NODE_REPEAT };

typedef struct node {
    enum node_kind kind;
    uint32_t min, max;   /* NODE_REPEAT; max REPEAT_INF for no bound */
    size_t off, n;       /* NODE_CLASS: ranges in p->ranges; CONCAT/ALT: kids in p->kids */
    uint32_t kid;        /* NODE_REPEAT: the operand */
} node;

typedef struct parser {
    const uint8_t *re;
    size_t len, pos;
    unsigned depth;
    node *nodes;
    size_t n_nodes, cap_nodes;
    cp_range *ranges;
    size_t n_ranges, cap_ranges;
    uint32_t *kids;
    size_t n_kids, cap_kids;
    shoal_diag *diag;
    shoal_err err;
} parser;

static shoal_err syntax(parser *p, size_t at, const char *what)
{
    p->err = shoal_diag_set(p->diag, SHOAL_ERR_INVALID, "regex: at byte %zu: %s", at, what);
    return p->err;
}

static shoal_err nomem(parser *p)
{
    p->err = shoal_diag_set(p->diag, SHOAL_ERR_NOMEM, "regex: out of memory");
    return p->err;
}

static bool new_node(parser *p, node nd, uint32_t *id)
{
    if (!grow((void **)&p->nodes, &p->cap_nodes, p->n_nodes + 1, sizeof *p->nodes)) {
        nomem(p);
        return false;
    }
    *id = (uint32_t)p->n_nodes;
    p->nodes[p->n_nodes++] = nd;
    return true;
}

/* Moves the ranges of set (freed) into a new class node. */
static bool class_node(parser *p, cp_set *set, uint32_t *id)
{
    bool ok = false;
    if (!set_drop_surrogates(set) ||
        !grow((void **)&p->ranges, &p->cap_ranges, p->n_ranges + set->n + 1, sizeof *p->ranges)) {
        nomem(p);
        goto out;
    }
    if (set->n > 0) /* an empty class ([^\s\S]) has no ranges and matches nothing */
        memcpy(p->ranges + p->n_ranges, set->r, set->n * sizeof *set->r);
    node nd = {.kind = NODE_CLASS, .off = p->n_ranges, .n = set->n};
    p->n_ranges += set->n;
    ok = new_node(p, nd, id);
out:
    free(set->r);
    *set = (cp_set){0};
    return ok;
}

/* Decodes one UTF-8 code point at p->pos; false (diag set) on bad UTF-8. */
static bool next_cp(parser *p, uint32_t *cp)
{
    const uint8_t *s = p->re + p->pos;
    size_t left = p->len - p->pos;
    uint32_t c = s[0], min;
    size_t n;
    if (c < 0x80) {
        *cp = c;
        p->pos++;
        return true;
    } else if ((c & 0xE0) == 0xC0) {
        n = 2, c &= 0x1F, min = 0x80;
    } else if ((c & 0xF0) == 0xE0) {
        n = 3, c &= 0x0F, min = 0x800;
    } else if ((c & 0xF8) == 0xF0) {
        n = 4, c &= 0x07, min = 0x10000;
    } else {
        syntax(p, p->pos, "expected UTF-8 text (a byte that cannot start a character)");
        return false;
    }
    if (left < n) {
        syntax(p, p->pos, "expected UTF-8 text (a character cut short)");
        return false;
    }
    for (size_t i = 1; i < n; i++) {
        if ((s[i] & 0xC0) != 0x80) {
            syntax(p, p->pos, "expected UTF-8 text (a bad continuation byte)");
            return false;
        }
        c = (c << 6) | (s[i] & 0x3F);
    }
    if (c < min || c > CP_MAX || (c >= 0xD800 && c <= 0xDFFF)) {
        syntax(p, p->pos, "expected UTF-8 text (an overlong form, a surrogate or past U+10FFFF)");
        return false;
    }
    *cp = c;
    p->pos += n;
    return true;
}

/* Adds the set of a class escape letter (d w s D W S) to set. */
static bool class_escape(cp_set *set, uint8_t letter)
{
    cp_set s = {0};
    bool ok = true;
    switch (letter | 0x20) {
    case 'd':
        ok = set_add(&s, '0', '9');
        break;
    case 'w':
        ok = set_add(&s, '0', '9') && set_add(&s, 'A', 'Z') && set_add(&s, '_', '_') &&
             set_add(&s, 'a', 'z');
        break;
    default: /* 's': \t \n \v \f \r and space */
        ok = set_add(&s, '\t', '\r') && set_add(&s, ' ', ' ');
        break;
    }
    set_normalize(&s);
    if (ok && letter < 'a')
        ok = set_negate(&s);
    for (size_t i = 0; ok && i < s.n; i++)
        ok = set_add(set, s.r[i].lo, s.r[i].hi);
    free(s.r);
    return ok;
}

static int hex_digit(uint8_t c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if ((c | 0x20) >= 'a' && (c | 0x20) <= 'f')
        return (c | 0x20) - 'a' + 10;
    return -1;
}

/* After a backslash at p->pos - 1: one code point (*is_class false) or a
 * class escape added to set (*is_class true). */
static bool parse_escape(parser *p, uint32_t *cp, bool *is_class, cp_set *set)
{
    size_t at = p->pos - 1;
    *is_class = false;
    if (p->pos >= p->len) {
        syntax(p, at, "expected an escaped character after '\\'");
        return false;
    }
    uint8_t c = p->re[p->pos++];
    switch (c) {
    case 'n': *cp = '\n'; return true;
    case 'r': *cp = '\r'; return true;
    case 't': *cp = '\t'; return true;
    case 'f': *cp = '\f'; return true;
    case 'v': *cp = '\v'; return true;
    case 'd': case 'w': case 's': case 'D': case 'W': case 'S':
        *is_class = true;
        if (!class_escape(set, c)) {
            nomem(p);
            return false;
        }
        return true;
    case 'u': {
        uint32_t v = 0;
        for (int i = 0; i < 4; i++) {
            int h = p->pos < p->len ? hex_digit(p->re[p->pos]) : -1;
            if (h < 0) {
                syntax(p, p->pos, "expected four hex digits after \\u");
                return false;
            }
            v = v * 16 + (uint32_t)h;
            p->pos++;
        }
        if (v >= 0xD800 && v <= 0xDFFF) {
            syntax(p, at, "\\u names a surrogate, which no UTF-8 text holds");
            return false;
        }
        *cp = v;
        return true;
    }
    default:
        if (c < 0x80 && ((c >= '!' && c <= '/') || (c >= ':' && c <= '@') ||
                         (c >= '[' && c <= '`') || (c >= '{' && c <= '~'))) {
            *cp = c;
            return true;
        }
        syntax(p, at, "expected an escape: \\n \\r \\t \\f \\v \\d \\w \\s \\D \\W \\S \\uXXXX "
                      "or a backslash before punctuation");
        return false;
    }
}

/* After '[' at p->pos - 1. */
static bool parse_class(parser *p, uint32_t *id)
{
    size_t open = p->pos - 1;
    cp_set set = {0};
    bool negate = false, first = true;
    if (p->pos < p->len && p->re[p->pos] == '^') {
        negate = true;
        p->pos++;
    }
    for (;;) {
        if (p->pos >= p->len) {
            syntax(p, open, "expected ']' to close this class");
            goto out_fail;
        }
        if (p->re[p->pos] == ']' && !first) {
            p->pos++;
            break;
        }
        first = false;
        uint32_t lo, hi;
        bool is_class;
        if (p->re[p->pos] == '\\') {
            p->pos++;
            if (!parse_escape(p, &lo, &is_class, &set))
                goto out_fail;
            if (is_class)
                continue;
        } else if (!next_cp(p, &lo)) {
            goto out_fail;
        }
        hi = lo;
        if (p->pos + 1 < p->len && p->re[p->pos] == '-' && p->re[p->pos + 1] != ']') {
            size_t dash = p->pos;
            p->pos++;
            if (p->re[p->pos] == '\\') {
                p->pos++;
                if (!parse_escape(p, &hi, &is_class, &set))
                    goto out_fail;
                if (is_class) {
                    syntax(p, dash, "expected a character after '-', not a class escape");
                    goto out_fail;
                }
            } else if (!next_cp(p, &hi)) {
                goto out_fail;
            }
            if (hi < lo) {
                syntax(p, dash, "expected a range whose end is not below its start");
                goto out_fail;
            }
        }
        if (!set_add(&set, lo, hi)) {
            nomem(p);
            goto out_fail;
        }
    }
    set_normalize(&set);
    if (negate && !set_negate(&set)) {
        nomem(p);
        goto out_fail;
    }
    return class_node(p, &set, id);
out_fail:
    free(set.r);
    return false;
}

static bool parse_alt(parser *p, uint32_t *id);

/* A decimal count of a quantifier; false if none is at p->pos. */
static bool parse_count(parser *p, uint32_t *v)
{
    size_t start = p->pos;
    uint64_t x = 0;
    while (p->pos < p->len && p->re[p->pos] >= '0' && p->re[p->pos] <= '9') {
        x = x * 10 + (p->re[p->pos] - '0');
        if (x > 1000000)
            x = 1000000;
        p->pos++;
    }
    *v = (uint32_t)x;
    return p->pos > start;
}

static bool parse_atom(parser *p, uint32_t *id)
{
    size_t at = p->pos;
    uint8_t c = p->re[p->pos];
    cp_set set = {0};
    uint32_t cp;
    bool is_class;
    switch (c) {
    case '(':
        p->pos++;
        if (p->pos + 1 < p->len && p->re[p->pos] == '?') {
            if (p->re[p->pos + 1] != ':')
                return syntax(p, p->pos, "expected ':' after '(?' (only (?: ) groups)"), false;
            p->pos += 2;
        }
        if (++p->depth > SHOAL_GRAMMAR_DEPTH_MAX) {
            p->err = shoal_diag_set(p->diag, SHOAL_ERR_LIMIT,
                                    "regex: at byte %zu: groups nest deeper than %d "
                                    "(SHOAL_GRAMMAR_DEPTH_MAX)",
                                    at, SHOAL_GRAMMAR_DEPTH_MAX);
            return false;
        }
        if (!parse_alt(p, id))
            return false;
        p->depth--;
        if (p->pos >= p->len || p->re[p->pos] != ')')
            return syntax(p, at, "expected ')' to close this group"), false;
        p->pos++;
        return true;
    case '[':
        p->pos++;
        return parse_class(p, id);
    case '.':
        p->pos++;
        if (!set_add(&set, 0, '\n' - 1) || !set_add(&set, '\n' + 1, CP_MAX)) {
            free(set.r);
            return nomem(p), false;
        }
        return class_node(p, &set, id);
    case '*': case '+': case '?': case '{':
        return syntax(p, at, "expected something to repeat before this quantifier"), false;
    case '^': case '$':
        return syntax(p, at, "expected no anchor: the whole text always matches the whole regex "
                             "(escape it for the character)"), false;
    case '\\':
        p->pos++;
        if (!parse_escape(p, &cp, &is_class, &set)) {
            free(set.r);
            return false;
        }
        if (is_class) {
            set_normalize(&set);
            return class_node(p, &set, id);
        }
        break;
    default:
        if (!next_cp(p, &cp))
            return false;
        break;
    }
    if (!set_add(&set, cp, cp)) {
        free(set.r);
        return nomem(p), false;
    }
    return class_node(p, &set, id);
}

/* An atom and its quantifiers. */
static bool parse_repeat(parser *p, uint32_t *id)
{
    if (!parse_atom(p, id))
        return false;
    if (p->pos >= p->len)
        return true;
    size_t at = p->pos;
    uint8_t c = p->re[p->pos];
    uint32_t min, max;
    if (c == '*' || c == '+' || c == '?') {
        p->pos++;
        min = c == '+';
        max = c == '?' ? 1 : REPEAT_INF;
    } else if (c == '{') {
        p->pos++;
        if (!parse_count(p, &min))
            return syntax(p, p->pos, "expected a count after '{'"), false;
        max = min;
        if (p->pos < p->len && p->re[p->pos] == ',') {
            p->pos++;
            uint32_t m;
            max = parse_count(p, &m) ? m : REPEAT_INF;
            if (max < min)
                return syntax(p, at, "expected {n,m} with m not below n"), false;
        }
        if (p->pos >= p->len || p->re[p->pos] != '}')
            return syntax(p, p->pos, "expected '}' to close the quantifier"), false;
        p->pos++;
        if (min > SHOAL_GRAMMAR_REPEAT_MAX || (max != REPEAT_INF && max > SHOAL_GRAMMAR_REPEAT_MAX)) {
            p->err = shoal_diag_set(p->diag, SHOAL_ERR_LIMIT,
                                    "regex: at byte %zu: a count over %d (SHOAL_GRAMMAR_REPEAT_MAX)",
                                    at, SHOAL_GRAMMAR_REPEAT_MAX);
            return false;
        }
    } else {
        return true;
    }
    if (p->pos < p->len && strchr("*+?{", p->re[p->pos]))
        return syntax(p, p->pos, "expected no second quantifier (no lazy or possessive forms; "
                                 "group the first)"), false;
    node nd = {.kind = NODE_REPEAT, .min = min, .max = max, .kid = *id};
    return new_node(p, nd, id);
}

/* Gathers kids into a CONCAT or ALT node. */
static bool list_node(parser *p, enum node_kind kind, const uint32_t *kids, size_t n, uint32_t *id)
{
    if (!grow((void **)&p->kids, &p->cap_kids, p->n_kids + n + 1, sizeof *p->kids))
        return nomem(p), false;
    if (n > 0)
        memcpy(p->kids + p->n_kids, kids, n * sizeof *kids);
    node nd = {.kind = kind, .off = p->n_kids, .n = n};
    p->n_kids += n;
    return new_node(p, nd, id);
}

static bool parse_concat(parser *p, uint32_t *id)
{
    uint32_t *kids = NULL;
    size_t n = 0, cap = 0;
    bool ok = false;
    while (p->pos < p->len && p->re[p->pos] != '|' && p->re[p->pos] != ')') {
        uint32_t k;
        if (!parse_repeat(p, &k))
            goto out;
        if (!grow((void **)&kids, &cap, n + 1, sizeof *kids)) {
            nomem(p);
            goto out;
        }
        kids[n++] = k;
    }
    if (n == 1) {
        *id = kids[0];
        ok = true;
    } else {
        ok = list_node(p, NODE_CONCAT, kids, n, id);
    }
out:
    free(kids);
    return ok;
}

static bool parse_alt(parser *p, uint32_t *id)
{
    uint32_t *kids = NULL;
    size_t n = 0, cap = 0;
    bool ok = false;
    for (;;) {
        uint32_t k;
        if (!parse_concat(p, &k))
            goto out;
        if (!grow((void **)&kids, &cap, n + 1, sizeof *kids)) {
            nomem(p);
            goto out;
        }
        kids[n++] = k;
        if (p->pos >= p->len || p->re[p->pos] != '|')
            break;
        p->pos++;
    }
    if (n == 1) {
        *id = kids[0];
        ok = true;
    } else {
        ok = list_node(p, NODE_ALT, kids, n, id);
    }
out:
    free(kids);
    return ok;
}

/* ---- NFA ---------------------------------------------------------------- */

/* An edge on bytes lo..hi, or an epsilon edge (eps). Edges of one state are
 * a list through next. */
typedef struct nfa_edge {
    uint8_t lo, hi;
    bool eps;
    uint32_t to, next;
} nfa_edge;

#define NO_EDGE UINT32_MAX

typedef struct nfa {
    uint32_t *first; /* per state: its first edge or NO_EDGE */
    size_t n_states, cap_states;
    nfa_edge *edges;
    size_t n_edges, cap_edges;
    uint32_t states_max;
    shoal_diag *diag;
    shoal_err err;
} nfa;

typedef struct frag {
    uint32_t start, end;
} frag;

static bool nfa_state(nfa *a, uint32_t *s)
{
    if (a->n_states >= a->states_max) {
        a->err = shoal_diag_set(a->diag, SHOAL_ERR_LIMIT,
                                "regex: the NFA needs more than %u states "
                                "(grammar_limits.nfa_states_max; quantifiers copy their operand)",
                                a->states_max);
        return false;
    }
    if (!grow((void **)&a->first, &a->cap_states, a->n_states + 1, sizeof *a->first)) {
        a->err = shoal_diag_set(a->diag, SHOAL_ERR_NOMEM, "regex: out of memory");
        return false;
    }
    a->first[a->n_states] = NO_EDGE;
    *s = (uint32_t)a->n_states++;
    return true;
}

static bool nfa_edge_add(nfa *a, uint32_t from, uint32_t to, bool eps, uint8_t lo, uint8_t hi)
{
    if (!grow((void **)&a->edges, &a->cap_edges, a->n_edges + 1, sizeof *a->edges)) {
        a->err = shoal_diag_set(a->diag, SHOAL_ERR_NOMEM, "regex: out of memory");
        return false;
    }
    a->edges[a->n_edges] = (nfa_edge){lo, hi, eps, to, a->first[from]};
    a->first[from] = (uint32_t)a->n_edges++;
    return true;
}

static int utf8_encode(uint32_t cp, uint8_t out[4])
{
    if (cp < 0x80) {
        out[0] = (uint8_t)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (uint8_t)(0xC0 | (cp >> 6));
        out[1] = (uint8_t)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (uint8_t)(0xE0 | (cp >> 12));
        out[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (uint8_t)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (uint8_t)(0xF0 | (cp >> 18));
    out[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (uint8_t)(0x80 | (cp & 0x3F));
    return 4;
}

/* Adds paths from s to e that read exactly the UTF-8 encodings of lo..hi
 * (no surrogates inside). The range is split until every byte position
 * ranges independently: first at the encoding-length boundaries, then
 * wherever lo and hi differ above a 6-bit continuation group while not
 * spanning that group's whole range. */
static bool utf8_range(nfa *a, uint32_t s, uint32_t e, uint32_t lo, uint32_t hi)
{
    static const uint32_t len_max[3] = {0x7F, 0x7FF, 0xFFFF};
    for (int i = 0; i < 3; i++)
        if (lo <= len_max[i] && hi > len_max[i])
            return utf8_range(a, s, e, lo, len_max[i]) && utf8_range(a, s, e, len_max[i] + 1, hi);
    if (hi >= 0x80) {
        for (int i = 1; i < 4; i++) {
            uint32_t m = (1u << (6 * i)) - 1;
            if ((lo & ~m) != (hi & ~m)) {
                if ((lo & m) != 0)
                    return utf8_range(a, s, e, lo, lo | m) && utf8_range(a, s, e, (lo | m) + 1, hi);
                if ((hi & m) != m)
                    return utf8_range(a, s, e, lo, (hi & ~m) - 1) && utf8_range(a, s, e, hi & ~m, hi);
            }
        }
    }
    uint8_t bl[4], bh[4];
    int n = utf8_encode(lo, bl);
    SHOAL_ASSERT(utf8_encode(hi, bh) == n);
    uint32_t from = s;
    for (int i = 0; i < n; i++) {
        uint32_t to = e;
        if (i + 1 < n && !nfa_state(a, &to))
            return false;
        if (!nfa_edge_add(a, from, to, false, bl[i], bh[i]))
            return false;
        from = to;
    }
    return true;
}

static bool nfa_build(nfa *a, const parser *p, uint32_t id, frag *out);

static bool nfa_build_repeat(nfa *a, const parser *p, const node *nd, frag *out)
{
    uint32_t cur;
    if (!nfa_state(a, &cur))
        return false;
    out->start = cur;
    for (uint32_t i = 0; i < nd->min; i++) {
        frag f;
        if (!nfa_build(a, p, nd->kid, &f) || !nfa_edge_add(a, cur, f.start, true, 0, 0))
            return false;
        cur = f.end;
    }
    if (nd->max == REPEAT_INF) {
        /* cur -> operand -> back to cur, or on to the end */
        frag f;
        uint32_t end;
        if (!nfa_build(a, p, nd->kid, &f) || !nfa_state(a, &end) ||
            !nfa_edge_add(a, cur, f.start, true, 0, 0) || !nfa_edge_add(a, f.end, cur, true, 0, 0) ||
            !nfa_edge_add(a, cur, end, true, 0, 0))
            return false;
        out->end = end;
        return true;
    }
    uint32_t end;
    if (!nfa_state(a, &end))
        return false;
    for (uint32_t i = nd->min; i < nd->max; i++) {
        frag f;
        if (!nfa_build(a, p, nd->kid, &f) || !nfa_edge_add(a, cur, f.start, true, 0, 0) ||
            !nfa_edge_add(a, cur, end, true, 0, 0))
            return false;
        cur = f.end;
    }
    out->end = end;
    return nfa_edge_add(a, cur, end, true, 0, 0);
}

/* A fresh copy of the subtree id (a quantifier builds its operand once per
 * count). Recursion depth follows group nesting, bounded by the parser. */
static bool nfa_build(nfa *a, const parser *p, uint32_t id, frag *out)
{
    const node *nd = &p->nodes[id];
    switch (nd->kind) {
    case NODE_CLASS:
        if (!nfa_state(a, &out->start) || !nfa_state(a, &out->end))
            return false;
        for (size_t i = 0; i < nd->n; i++)
            if (!utf8_range(a, out->start, out->end, p->ranges[nd->off + i].lo,
                            p->ranges[nd->off + i].hi))
                return false;
        return true;
    case NODE_CONCAT: {
        if (!nfa_state(a, &out->start))
            return false;
        uint32_t cur = out->start;
        for (size_t i = 0; i < nd->n; i++) {
            frag f;
            if (!nfa_build(a, p, p->kids[nd->off + i], &f) ||
                !nfa_edge_add(a, cur, f.start, true, 0, 0))
                return false;
            cur = f.end;
        }
        out->end = cur;
        return true;
    }
    case NODE_ALT:
        if (!nfa_state(a, &out->start) || !nfa_state(a, &out->end))
            return false;
        for (size_t i = 0; i < nd->n; i++) {
            frag f;
            if (!nfa_build(a, p, p->kids[nd->off + i], &f) ||
                !nfa_edge_add(a, out->start, f.start, true, 0, 0) ||
                !nfa_edge_add(a, f.end, out->end, true, 0, 0))
                return false;
        }
        return true;
    case NODE_REPEAT:
        return nfa_build_repeat(a, p, nd, out);
    }
    SHOAL_ASSERT(!"unknown node kind");
    return false;
}

/* ---- DFA ---------------------------------------------------------------- */

struct grammar_dfa {
    struct grammar_dfa_core core; /* first: grammar_dfa_step reads it */
    int32_t *next;
    uint8_t *accepting;
};

_Static_assert(offsetof(struct grammar_dfa, core) == 0, "grammar_dfa_step casts the handle");

/* The subset construction's working state. A DFA state stands for the set
 * of NFA states reachable by epsilon edges that have a byte edge, plus the
 * accepting NFA state: the others add nothing to the future. */
typedef struct subset {
    const nfa *a;
    uint32_t accept;
    uint32_t *mark; /* per NFA state: the stamp of the last closure that saw it */
    uint32_t stamp;
    uint32_t *stack;
    uint32_t *members; /* all sets, one after another */
    size_t n_members, cap_members;
    size_t *set_off; /* per DFA state: its set in members; set_off[n] is the end */
    size_t cap_off;
    uint32_t n_dfa;
    uint32_t *table; /* hash -> DFA state + 1, 0 empty */
    size_t table_cap;
    int32_t *next;
    size_t cap_next;
    uint8_t *accepting;
    size_t cap_acc;
    uint32_t n_classes;
} subset;

static int u32_cmp(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

static uint64_t set_hash(const uint32_t *s, size_t n)
{
    uint64_t h = 1469598103934665603ull ^ n;
    for (size_t i = 0; i < n; i++)
        h = (h ^ s[i]) * 1099511628211ull;
    return h ^ (h >> 29);
}

/* Closes seeds[0..n) under epsilon edges; appends the kept members, sorted,
 * at sb->members + sb->n_members (not yet committed). Returns their count. */
static bool closure(subset *sb, const uint32_t *seeds, size_t n, size_t *count)
{
    const nfa *a = sb->a;
    size_t top = 0, kept = 0;
    sb->stamp++;
    for (size_t i = 0; i < n; i++)
        if (sb->mark[seeds[i]] != sb->stamp) {
            sb->mark[seeds[i]] = sb->stamp;
            sb->stack[top++] = seeds[i];
        }
    while (top) {
        uint32_t s = sb->stack[--top];
        bool keep = s == sb->accept;
        for (uint32_t e = a->first[s]; e != NO_EDGE; e = a->edges[e].next) {
            if (!a->edges[e].eps) {
                keep = true;
                continue;
            }
            uint32_t t = a->edges[e].to;
            if (sb->mark[t] != sb->stamp) {
                sb->mark[t] = sb->stamp;
                sb->stack[top++] = t;
            }
        }
        if (keep) {
            if (!grow((void **)&sb->members, &sb->cap_members, sb->n_members + kept + 1,
                      sizeof *sb->members))
                return false;
            sb->members[sb->n_members + kept++] = s;
        }
    }
    if (kept > 1)
        qsort(sb->members + sb->n_members, kept, sizeof *sb->members, u32_cmp);
    *count = kept;
    return true;
}

static bool table_rehash(subset *sb)
{
    size_t cap = sb->table_cap ? sb->table_cap * 2 : 1024;
    uint32_t *t = calloc(cap, sizeof *t);
    if (!t)
        return false;
    for (uint32_t d = 0; d < sb->n_dfa; d++) {
        uint64_t h = set_hash(sb->members + sb->set_off[d], sb->set_off[d + 1] - sb->set_off[d]);
        size_t i = h & (cap - 1);
        while (t[i])
            i = (i + 1) & (cap - 1);
        t[i] = d + 1;
    }
    free(sb->table);
    sb->table = t;
    sb->table_cap = cap;
    return true;
}

/* The DFA state of the pending set (count members at n_members), added if
 * new. An empty set is GRAMMAR_DEAD. */
static shoal_err intern(subset *sb, size_t count, uint32_t dfa_states_max, int32_t *state,
                        shoal_diag *diag)
{
    if (count == 0) {
        *state = GRAMMAR_DEAD;
        return SHOAL_OK;
    }
    const uint32_t *set = sb->members + sb->n_members;
    uint64_t h = set_hash(set, count);
    size_t i = h & (sb->table_cap - 1);
    for (; sb->table[i]; i = (i + 1) & (sb->table_cap - 1)) {
        uint32_t d = sb->table[i] - 1;
        size_t n = sb->set_off[d + 1] - sb->set_off[d];
        if (n == count && !memcmp(sb->members + sb->set_off[d], set, count * sizeof *set)) {
            *state = (int32_t)d;
            return SHOAL_OK;
        }
    }
    if (sb->n_dfa >= dfa_states_max)
        return shoal_diag_set(diag, SHOAL_ERR_LIMIT,
                              "regex: the DFA needs more than %u states "
                              "(grammar_limits.dfa_states_max)",
                              dfa_states_max);
    uint32_t d = sb->n_dfa;
    if (!grow((void **)&sb->set_off, &sb->cap_off, d + 2, sizeof *sb->set_off) ||
        !grow((void **)&sb->next, &sb->cap_next, (size_t)(d + 1) * sb->n_classes, sizeof *sb->next) ||
        !grow((void **)&sb->accepting, &sb->cap_acc, d + 1, 1))
        return shoal_diag_set(diag, SHOAL_ERR_NOMEM, "regex: out of memory");
    bool acc = false;
    for (size_t k = 0; k < count; k++)
        acc |= set[k] == sb->accept;
    sb->accepting[d] = acc;
    sb->n_members += count;
    sb->set_off[d + 1] = sb->n_members;
    sb->table[i] = d + 1;
    sb->n_dfa++;
    if (sb->n_dfa * 2 > sb->table_cap && !table_rehash(sb))
        return shoal_diag_set(diag, SHOAL_ERR_NOMEM, "regex: out of memory");
    *state = (int32_t)d;
    return SHOAL_OK;
}

/* Byte classes: bytes that fall on the same side of every edge's bounds. */
static uint32_t byte_classes(const nfa *a, uint8_t class_of[256], uint8_t rep[256])
{
    bool cut[257] = {false};
    for (size_t e = 0; e < a->n_edges; e++)
        if (!a->edges[e].eps) {
            cut[a->edges[e].lo] = true;
            cut[a->edges[e].hi + 1] = true;
        }
    uint32_t n = 0;
    for (int b = 0; b < 256; b++) {
        if (b > 0 && cut[b])
            n++;
        class_of[b] = (uint8_t)n;
        if (b == 0 || cut[b])
            rep[n] = (uint8_t)b;
    }
    return n + 1;
}

/* Drops the states from which no accepting state can be reached (except
 * the start, kept as state 0); transitions into them become GRAMMAR_DEAD. */
static shoal_err prune(grammar_dfa *dfa, shoal_diag *diag)
{
    uint32_t n = dfa->core.n_states, k = dfa->core.n_classes;
    shoal_err err = shoal_diag_set(diag, SHOAL_ERR_NOMEM, "regex: out of memory");
    uint32_t *rev_off = calloc((size_t)n + 1, sizeof *rev_off);
    uint32_t *rev = malloc(((size_t)n * k + 1) * sizeof *rev);
    uint32_t *queue = malloc(((size_t)n + 1) * sizeof *queue);
    uint8_t *live = calloc(n, 1);
    int32_t *renum = malloc(((size_t)n + 1) * sizeof *renum);
    if (!rev_off || !rev || !queue || !live || !renum)
        goto out;
    for (size_t i = 0; i < (size_t)n * k; i++)
        if (dfa->next[i] >= 0)
            rev_off[dfa->next[i] + 1]++;
    for (uint32_t s = 0; s < n; s++)
        rev_off[s + 1] += rev_off[s];
    for (size_t i = 0; i < (size_t)n * k; i++)
        if (dfa->next[i] >= 0)
            rev[rev_off[dfa->next[i]]++] = (uint32_t)(i / k);
    for (uint32_t s = n; s > 0; s--) /* back to each state's first slot */
        rev_off[s] = rev_off[s - 1];
    rev_off[0] = 0;
    uint32_t head = 0, tail = 0;
    for (uint32_t s = 0; s < n; s++)
        if (dfa->accepting[s]) {
            live[s] = 1;
            queue[tail++] = s;
        }
    while (head < tail) {
        uint32_t t = queue[head++];
        for (uint32_t j = rev_off[t]; j < rev_off[t + 1]; j++)
            if (!live[rev[j]]) {
                live[rev[j]] = 1;
                queue[tail++] = rev[j];
            }
    }
    uint32_t m = 0;
    for (uint32_t s = 0; s < n; s++)
        renum[s] = (live[s] || s == 0) ? (int32_t)m++ : GRAMMAR_DEAD;
    for (uint32_t s = 0; s < n; s++) {
        if (renum[s] < 0)
            continue;
        for (uint32_t c = 0; c < k; c++) {
            int32_t t = dfa->next[(size_t)s * k + c];
            dfa->next[(size_t)renum[s] * k + c] = t >= 0 && live[t] ? renum[t] : GRAMMAR_DEAD;
        }
        dfa->accepting[renum[s]] = dfa->accepting[s];
    }
    dfa->core.n_states = m;
    shoal_diag_clear(diag);
    err = SHOAL_OK;
out:
    free(rev_off);
    free(rev);
    free(queue);
    free(live);
    free(renum);
    return err;
}

static shoal_err determinize(const nfa *a, uint32_t start, uint32_t accept, uint32_t dfa_states_max,
                             grammar_dfa *dfa, shoal_diag *diag)
{
    subset sb = {.a = a, .accept = accept};
    uint8_t rep[256];
    uint32_t *seeds = NULL;
    size_t cap_seeds = 0;
    shoal_err err = SHOAL_ERR_NOMEM;
    sb.n_classes = byte_classes(a, dfa->core.class_of, rep);
    sb.mark = calloc(a->n_states, sizeof *sb.mark);
    sb.stack = malloc(a->n_states * sizeof *sb.stack);
    sb.set_off = calloc(2, sizeof *sb.set_off);
    sb.cap_off = 2;
    if (!sb.mark || !sb.stack || !sb.set_off || !table_rehash(&sb))
        goto out_nomem;
    size_t count;
    int32_t s0;
    if (!closure(&sb, &start, 1, &count))
        goto out_nomem;
    if (count == 0) {
        /* A regex that matches nothing ([^\s\S]): one state, no way on. */
        dfa->core.n_states = 1;
        dfa->core.n_classes = sb.n_classes;
        dfa->next = malloc(sb.n_classes * sizeof *dfa->next);
        dfa->accepting = calloc(1, 1);
        if (!dfa->next || !dfa->accepting)
            goto out_nomem;
        for (uint32_t c = 0; c < sb.n_classes; c++)
            dfa->next[c] = GRAMMAR_DEAD;
        err = SHOAL_OK;
        goto out;
    }
    if ((err = intern(&sb, count, dfa_states_max, &s0, diag)) != SHOAL_OK)
        goto out;
    for (uint32_t d = 0; d < sb.n_dfa; d++) {
        for (uint32_t c = 0; c < sb.n_classes; c++) {
            uint8_t b = rep[c];
            size_t n_seeds = 0;
            for (size_t i = sb.set_off[d]; i < sb.set_off[d + 1]; i++)
                for (uint32_t e = a->first[sb.members[i]]; e != NO_EDGE; e = a->edges[e].next) {
                    const nfa_edge *ed = &a->edges[e];
                    if (ed->eps || b < ed->lo || b > ed->hi)
                        continue;
                    if (!grow((void **)&seeds, &cap_seeds, n_seeds + 1, sizeof *seeds))
                        goto out_nomem;
                    seeds[n_seeds++] = ed->to;
                }
            int32_t t;
            if (!closure(&sb, seeds, n_seeds, &count))
                goto out_nomem;
            if ((err = intern(&sb, count, dfa_states_max, &t, diag)) != SHOAL_OK)
                goto out;
            sb.next[(size_t)d * sb.n_classes + c] = t;
        }
    }
    dfa->core.n_states = sb.n_dfa;
    dfa->core.n_classes = sb.n_classes;
    dfa->next = sb.next;
    dfa->accepting = sb.accepting;
    sb.next = NULL;
    sb.accepting = NULL;
    err = SHOAL_OK;
    goto out;
out_nomem:
    err = shoal_diag_set(diag, SHOAL_ERR_NOMEM, "regex: out of memory");
out:
    free(seeds);
    free(sb.mark);
    free(sb.stack);
    free(sb.members);
    free(sb.set_off);
    free(sb.table);
    free(sb.next);
    free(sb.accepting);
    return err;
}

shoal_err grammar_dfa_compile(const char *re, size_t len, const grammar_limits *limits,
                              grammar_dfa **out, shoal_diag *diag)
{
    grammar_limits def;
    if (!limits) {
        grammar_limits_default(&def);
        limits = &def;
    }
    *out = NULL;
    if (len > SHOAL_GRAMMAR_REGEX_BYTES_MAX)
        return shoal_diag_set(diag, SHOAL_ERR_LIMIT,
                              "regex: %zu bytes, over %u (SHOAL_GRAMMAR_REGEX_BYTES_MAX)", len,
                              SHOAL_GRAMMAR_REGEX_BYTES_MAX);
    parser p = {.re = (const uint8_t *)re, .len = len, .diag = diag};
    nfa a = {.states_max = limits->nfa_states_max, .diag = diag};
    grammar_dfa *dfa = NULL;
    shoal_err err;
    uint32_t root;
    frag f;
    if (!parse_alt(&p, &root)) {
        err = p.err;
        goto out;
    }
    if (p.pos < p.len) { /* parse_alt stops early only at an unmatched ')' */
        err = syntax(&p, p.pos, "expected the end of the regex or '|', not an unmatched ')'");
        goto out;
    }
    if (!nfa_build(&a, &p, root, &f)) {
        err = a.err;
        goto out;
    }
    dfa = calloc(1, sizeof *dfa);
    if (!dfa) {
        err = shoal_diag_set(diag, SHOAL_ERR_NOMEM, "regex: out of memory");
        goto out;
    }
    if ((err = determinize(&a, f.start, f.end, limits->dfa_states_max, dfa, diag)) != SHOAL_OK ||
        (err = prune(dfa, diag)) != SHOAL_OK)
        goto out;
    dfa->core.next = dfa->next;
    *out = dfa;
    dfa = NULL;
out:
    grammar_dfa_free(dfa);
    free(p.nodes);
    free(p.ranges);
    free(p.kids);
    free(a.first);
    free(a.edges);
    return err;
}

void grammar_dfa_free(grammar_dfa *dfa)
{
    if (!dfa)
        return;
    free(dfa->next);
    free(dfa->accepting);
    free(dfa);
}

int32_t grammar_dfa_start(const grammar_dfa *dfa)
{
    (void)dfa;
    return 0;
}

uint32_t grammar_dfa_states(const grammar_dfa *dfa)
{
    return dfa->core.n_states;
}

bool grammar_dfa_accepting(const grammar_dfa *dfa, int32_t state)
{
    return state >= 0 && (uint32_t)state < dfa->core.n_states && dfa->accepting[state];
}
