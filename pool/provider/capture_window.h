/*
 * capture_window.h — whether a CUDA graph is being captured through a graph pool window anywhere in
 * the process (api/capture.c opens and closes the windows). While one is open no pool queries events
 * or fences, gives memory back (cudaFree and cuMemUnmap synchronise the device) or stitches pages:
 * those calls are illegal, or unsafe, during a capture (cuda_runtime_api.h,
 * cudaThreadExchangeStreamCaptureMode). Growth goes on: the backends allocate in relaxed capture mode.
 */
#ifndef GP_PROVIDER_CAPTURE_WINDOW_H
#define GP_PROVIDER_CAPTURE_WINDOW_H

#include <stdbool.h>

bool gp_capture_underway(void);
void gp_capture_window_opened(void);
void gp_capture_window_closed(void);

#endif /* GP_PROVIDER_CAPTURE_WINDOW_H */
