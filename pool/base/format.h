/*
 * format.h — human-readable sizes for messages and printed stats ("3.0 GiB", "512 B").
 */
#ifndef GP_FORMAT_H
#define GP_FORMAT_H

#include <stddef.h>

#define GP_SIZE_TEXT_MAX 32

/* Writes `bytes` as text into buf (GP_SIZE_TEXT_MAX bytes) and returns buf. */
const char *gp_format_size(size_t bytes, char *buf);

#endif /* GP_FORMAT_H */
