/*
 * expect.h — the non-fatal check of the plain threaded test programs (the ones Criterion cannot run,
 * so that TSan sees every thread): EXPECT counts a failure under a lock and says where and why,
 * with the pool's last error; the program's main returns non-zero when `failures` is. Included once
 * per program.
 */
#ifndef GP_TESTS_STRESS_EXPECT_H
#define GP_TESTS_STRESS_EXPECT_H

#include <pthread.h>
#include <stdio.h>

#include "gpupool.h"

static int failures;
static pthread_mutex_t failure_lock = PTHREAD_MUTEX_INITIALIZER;

#define EXPECT(cond, ...)                                                                                      \
    do {                                                                                                       \
        if (!(cond)) {                                                                                         \
            pthread_mutex_lock(&failure_lock);                                                                 \
            failures++;                                                                                        \
            fprintf(stderr, "%s:%d: ", __FILE__, __LINE__);                                                    \
            fprintf(stderr, __VA_ARGS__);                                                                      \
            fprintf(stderr, " [%s]\n", gp_last_error());                                                      \
            pthread_mutex_unlock(&failure_lock);                                                               \
        }                                                                                                      \
    } while (0)

#endif /* GP_TESTS_STRESS_EXPECT_H */
