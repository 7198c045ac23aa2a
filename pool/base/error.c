/*
 * error.c — gp_strerror and the per-thread last-error message.
 */
#include "base/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define GP_ERROR_MESSAGE_MAX 1024

static _Thread_local char last_message[GP_ERROR_MESSAGE_MAX];

GP_API const char *gp_strerror(int error)
{
    switch (error) {
    case GP_OK: return "success";
    case GP_ERR_INVALID: return "invalid argument";
    case GP_ERR_OOM: return "out of device memory";
    case GP_ERR_DEVICE: return "device call failed";
    case GP_ERR_CONFIG: return "bad configuration";
    case GP_ERR_NOT_OWNED: return "pointer not allocated by this pool";
    case GP_ERR_INTERIOR: return "pointer into the middle of a block";
    case GP_ERR_DOUBLE_FREE: return "double free";
    case GP_ERR_UNKNOWN_STREAM: return "stream not seen by this pool";
    case GP_ERR_DESTROYED: return "pool already destroyed";
    case GP_ERR_BACKEND: return "backend unavailable";
    case GP_ERR_NOT_READY: return "not ready";
    case GP_ERR_QUOTA: return "over budget";
    case GP_ERR_PAUSED: return "paused";
    case GP_ERR_CORRUPT: return "pool metadata corrupt";
    default: return "unknown error";
    }
}

GP_API const char *gp_last_error(void)
{
    return last_message;
}

int(gp_error_set)(int code, const char *fmt, ...) /* (name): not error.h's analyzer-only macro */
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_message, sizeof last_message, fmt, ap);
    va_end(ap);
    return code;
}

void gp_error_append(const char *fmt, ...)
{
    size_t used = strlen(last_message);
    if (used + 1 >= sizeof last_message)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_message + used, sizeof last_message - used, fmt, ap);
    va_end(ap);
}

void gp_error_clear(void)
{
    last_message[0] = '\0';
}
