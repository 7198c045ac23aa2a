/* conformance_capture.h — the graph capture case of conformance.c (included there; see item 3). */
static void case_capture(void)
{
    printf("     (capture: not yet)\n");
}
