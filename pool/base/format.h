/*
 * format.h — human-readable sizes for messages and printed stats ("3.0 GiB", "512 B"), and strings
 * quoted for JSON.
 */
#ifndef GP_FORMAT_H
#define GP_FORMAT_H

#include <stddef.h>

#define GP_SIZE_TEXT_MAX 32

/* Writes `bytes` as text into buf (GP_SIZE_TEXT_MAX bytes) and returns buf. */
const char *gp_format_size(size_t bytes, char *buf);

/*
 * Writes s as a quoted JSON string into out (cap bytes, NUL-terminated when cap > 0, like snprintf) and
 * returns the length it needs without the NUL. Quotes, backslashes and control bytes are escaped; a
 * byte that does not start a well-formed UTF-8 sequence becomes \ufffd, so the output is valid JSON
 * whatever bytes s holds. A string of n bytes needs at most 6 n + 2.
 */
size_t gp_format_json_string(char *out, size_t cap, const char *s);
#define GP_JSON_TEXT_MAX(n) (6 * (n) + 3)

#endif /* GP_FORMAT_H */
