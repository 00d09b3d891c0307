// A small strict JSON reader and the few writing helpers the Hugging Face files need
// (safetensors headers, config.json, the shard index). Strict: one value surrounded only by
// whitespace, no trailing commas, comments, NaN, leading zeros or duplicate object keys;
// strings must be valid UTF-8 with valid escapes. Nesting depth and sizes are bounded by the
// caller, so a hostile header cannot exhaust the stack.
#ifndef TRAINER_JSON_H
#define TRAINER_JSON_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef enum json_type { JSON_NULL, JSON_BOOL, JSON_NUMBER, JSON_STRING, JSON_ARRAY, JSON_OBJECT } json_type;

typedef struct json_value json_value;
struct json_value {
  json_type type;
  int boolean;          // JSON_BOOL
  double number;        // JSON_NUMBER, as strtod reads it
  int is_int;           // JSON_NUMBER written without fraction or exponent and within int64
  int64_t integer;      // its exact value when is_int
  char *string;         // JSON_STRING, NUL-terminated UTF-8 (a \u0000 escape is refused)
  size_t n;             // items of an array, members of an object
  json_value *items;    // (n) array items, or the values of an object's members
  char **keys;          // (n) an object's member names, in file order
};

// Parses text[0, n_text). Returns the root (free it with json_free), or NULL with a message
// in err saying what was expected and what was found at which byte offset. max_depth bounds
// the nesting of arrays and objects.
json_value *json_parse(const char *text, size_t n_text, int max_depth, char *err, size_t n_err);
void json_free(json_value *v);
// A whole JSON file of at most max_bytes, parsed (json_parse). NULL with a message naming path.
json_value *json_read_file(const char *path, size_t max_bytes, int max_depth, char *err, size_t n_err);
// Member `key` of an object; NULL when v is not an object or has no such member.
const json_value *json_get(const json_value *v, const char *key);
// "null", "a boolean", "a number", ... for messages.
const char *json_type_name(json_type t);

// Writes s as a JSON string (quoted, escaped).
void json_put_string(FILE *f, const char *s);
// The shortest decimal text (6 to 9 significant digits) that reads back, through strtod and a
// cast to float, as exactly x: 3e-4f gives "0.0003", not 0.000300000014. x must be finite.
void json_float_text(float x, char buf[32]);

#endif
