/* grammar_schema.h: JSON Schema, response_format json_object and guided
 * choice, each compiled to a regex of grammar_regex.h's dialect (structured
 * outputs, issue #42).
 *
 * Every match of a schema's regex is JSON text that validates against the
 * schema; the regex is a subset of the valid documents, not all of them:
 *
 *   whitespace    the compact form: none, except one optional space
 *                 ([ ]?) after each ':' and ',' of an object or array
 *   strings       characters are unescaped code points other than '"', '\'
 *                 and U+0000..U+001F, or the escapes \" \\ \/ \b \f \n \r
 *                 \t \uXXXX (XXXX not a surrogate: a lone one is not text)
 *   properties    in the schema's order; the required ones always, the
 *                 others each present or absent (at most
 *                 SHOAL_GRAMMAR_OPTIONAL_MAX optional ones per object)
 *   extras        no property outside "properties" is ever generated,
 *                 whatever additionalProperties says (strict mode, as
 *                 xgrammar and outlines); an object schema without
 *                 "properties" whose additionalProperties is a schema gets
 *                 string keys with such values; one with neither gets any
 *                 object, SHOAL_GRAMMAR_JSON_DEPTH deep
 *   arrays        prefixItems, then items; without items, nothing after the
 *                 prefix is generated
 *   untyped       a schema without type (and none implied by its keywords)
 *                 is any JSON value, SHOAL_GRAMMAR_JSON_DEPTH deep
 *
 * Keywords: type (one or a list), enum and const (the values serialized
 * compactly; those outside the schema's type are dropped), properties,
 * required, additionalProperties, items, prefixItems, minItems, maxItems,
 * minLength, maxLength (counted in the characters above), pattern (the
 * dialect only, matched against the whole string: a leading ^ and trailing
 * $ are dropped; it may not match '"', '\' or a control character),
 * format (date, time, date-time, uuid; a date's day runs to 31 in every
 * month), minimum / maximum / exclusiveMinimum / exclusiveMaximum where
 * they only fix the sign (integer: >= 0, >= 1, <= 0, <= -1; number: >= 0),
 * anyOf and oneOf (both as anyOf: the alternatives need not exclude one
 * another), allOf of one schema, $ref to "#/$defs/NAME" or
 * "#/definitions/NAME" of the root, not recursive. title, description,
 * examples, default, $schema, $id, $comment, $defs and definitions are
 * ignored. */
#ifndef SHOAL_GRAMMAR_SCHEMA_H
#define SHOAL_GRAMMAR_SCHEMA_H

#include <stddef.h>

#include <cjson/cJSON.h>

#include "common/common_error.h"

/* Compiles schema (a JSON object, or true) to a regex; *out is NUL-ended,
 * malloc'd and the caller's (free), *len its bytes. Errors, each with diag
 * naming the schema path and the keyword ("schema: properties.age:
 * 'multipleOf' is not supported"):
 *   SHOAL_ERR_UNSUPPORTED  a keyword or value outside the list above, a
 *                          recursive $ref, a pattern outside the dialect
 *   SHOAL_ERR_FORMAT       a keyword of the wrong JSON type, a $ref that
 *                          names nothing, a schema nothing can satisfy
 *   SHOAL_ERR_LIMIT        a count over SHOAL_GRAMMAR_REPEAT_MAX, more
 *                          optional properties than SHOAL_GRAMMAR_OPTIONAL_MAX,
 *                          nesting over SHOAL_GRAMMAR_SCHEMA_DEPTH_MAX, a
 *                          regex over SHOAL_GRAMMAR_REGEX_BYTES_MAX
 *   SHOAL_ERR_NOMEM
 * On error *out is NULL. Any thread. */
shoal_err grammar_schema_regex(const cJSON *schema, char **out, size_t *len, shoal_diag *diag);

/* The regex of any JSON object whose brackets nest at most depth deep (1:
 * the values are scalars; a DFA cannot count brackets, so the depth is
 * bounded; response_format json_object uses SHOAL_GRAMMAR_JSON_DEPTH).
 * Compact whitespace as above. *out as grammar_schema_regex. Errors:
 * SHOAL_ERR_INVALID (depth 0), SHOAL_ERR_LIMIT (the regex would pass
 * SHOAL_GRAMMAR_REGEX_BYTES_MAX), SHOAL_ERR_NOMEM. Any thread. */
shoal_err grammar_json_object_regex(unsigned depth, char **out, size_t *len, shoal_diag *diag);

/* The regex matching exactly one of choices[0..n) as literal text (vLLM's
 * guided_choice: not quoted as JSON). *out as grammar_schema_regex.
 * Errors: SHOAL_ERR_INVALID (n == 0), SHOAL_ERR_LIMIT, SHOAL_ERR_NOMEM.
 * Any thread. */
shoal_err grammar_choice_regex(const char *const *choices, size_t n, char **out, size_t *len,
                               shoal_diag *diag);

#endif
