/*
 * error.h — error codes to text and the per-thread "what and why" message behind gp_last_error().
 */
#ifndef GP_ERROR_H
#define GP_ERROR_H

#include "gpupool.h"

/* Sets the calling thread's message (printf-style) and returns `code`, so that error paths read
 * `return gp_error_set(GP_ERR_INVALID, "size %zu larger than the device", size);`. */
int gp_error_set(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
#ifdef __clang_analyzer__
/* For clang-tidy's static analyzer only, which cannot see into error.c: it then knows that the code
 * comes back, and stops following `rc = gp_error_set(GP_ERR_..., ...)` as if rc could be GP_OK. */
#define gp_error_set(code, ...) (gp_error_set((code), __VA_ARGS__), (code))
#endif

/* Appends to the calling thread's message (used to add context on the way up). */
void gp_error_append(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Clears the calling thread's message. */
void gp_error_clear(void);

#endif /* GP_ERROR_H */
