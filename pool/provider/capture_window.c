/*
 * capture_window.c — the process-wide count of open graph pool windows (capture_window.h).
 */
#include "provider/capture_window.h"

#include <stdatomic.h>

static atomic_int windows_open;

bool gp_capture_underway(void)
{
    return atomic_load_explicit(&windows_open, memory_order_relaxed) != 0;
}

void gp_capture_window_opened(void)
{
    atomic_fetch_add(&windows_open, 1);
}

void gp_capture_window_closed(void)
{
    atomic_fetch_sub(&windows_open, 1);
}
