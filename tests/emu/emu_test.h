/*
 * emu_test.h — checks for the plain-program tests of tests/emu/ and tests/conformance/ (no
 * Criterion: they also run under TSan and, the conformance suite, on a machine with a real GPU).
 * CHECK counts a failure and says where; a program returns test_failures != 0.
 */
#ifndef GP_EMU_TEST_H
#define GP_EMU_TEST_H

#include <stdio.h>
#include <time.h>

static double test_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int test_failures;
static const char *test_current = "";

#define CHECK(cond, ...)                                                                                     \
    do {                                                                                                     \
        if (!(cond)) {                                                                                       \
            test_failures++;                                                                                 \
            fprintf(stderr, "FAIL %s (%s:%d): %s: ", test_current, __FILE__, __LINE__, #cond);               \
            fprintf(stderr, __VA_ARGS__);                                                                    \
            fputc('\n', stderr);                                                                             \
        }                                                                                                    \
    } while (0)

#define RUN(fn)                                                                                              \
    do {                                                                                                     \
        int before_ = test_failures;                                                                         \
        double t0_ = test_seconds();                                                                         \
        test_current = #fn;                                                                                  \
        fn();                                                                                                \
        printf("%s %s (%.1f s)\n", test_failures == before_ ? "ok  " : "FAIL", #fn, test_seconds() - t0_);   \
        fflush(stdout);                                                                                      \
    } while (0)

#endif /* GP_EMU_TEST_H */
