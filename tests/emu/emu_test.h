/*
 * emu_test.h — checks for the plain-program tests of tests/emu/ and tests/conformance/ (no
 * Criterion: they also run under TSan and, the conformance suite, on a machine with a real GPU).
 * CHECK counts a failure and says where; a program returns test_failures != 0.
 */
#ifndef GP_EMU_TEST_H
#define GP_EMU_TEST_H

#include <stdio.h>

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
        test_current = #fn;                                                                                  \
        fn();                                                                                                \
        printf("%s %s\n", test_failures == before_ ? "ok  " : "FAIL", #fn);                                  \
        fflush(stdout);                                                                                      \
    } while (0)

#endif /* GP_EMU_TEST_H */
