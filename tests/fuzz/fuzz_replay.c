/*
 * fuzz_replay.c — the driver that replays fuzz inputs as regression tests in the normal suite (no
 * libFuzzer, any compiler): every file named on the command line, or found in a folder named there
 * (sorted, so runs are repeatable), is read whole and fed once to the target's
 * LLVMFuzzerTestOneInput, the very function the libFuzzer build runs. A target reports a broken rule
 * by abort(), which fails the test; the driver prints each file before running it, so the last name
 * printed is the input that failed.
 *
 *   fuzz_api_replay tests/fuzz/api        # seeds and every crash input kept for the API target
 */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int run_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        perror(path);
        return 1;
    }
    size_t cap = 4096, len = 0;
    uint8_t *buf = malloc(cap);
    size_t n;
    while (buf != NULL && (n = fread(buf + len, 1, cap - len, f)) > 0) {
        len += n;
        if (len == cap) {
            uint8_t *grown = realloc(buf, cap * 2);
            if (grown == NULL) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = grown;
            cap *= 2;
        }
    }
    int bad = ferror(f) || buf == NULL;
    fclose(f);
    if (bad) {
        fprintf(stderr, "%s: cannot read it\n", path);
        free(buf);
        return 1;
    }
    printf("replaying %s (%zu bytes)\n", path, len);
    fflush(stdout);
    LLVMFuzzerTestOneInput(buf, len);
    free(buf);
    return 0;
}

static int by_name(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static int run_dir(const char *dir, size_t *count)
{
    DIR *d = opendir(dir);
    if (d == NULL) {
        perror(dir);
        return 1;
    }
    char **names = NULL;
    size_t n = 0, cap = 0;
    int failed = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue; /* ., .. and hidden files such as .gitkeep */
        if (n == cap) {
            cap = cap ? cap * 2 : 64;
            char **grown = realloc(names, cap * sizeof *names);
            if (grown == NULL) {
                failed = 1;
                break;
            }
            names = grown;
        }
        size_t len = strlen(dir) + strlen(e->d_name) + 2;
        names[n] = malloc(len);
        if (names[n] == NULL) {
            failed = 1;
            break;
        }
        snprintf(names[n], len, "%s/%s", dir, e->d_name);
        n++;
    }
    closedir(d);
    if (n > 0)
        qsort(names, n, sizeof *names, by_name);
    for (size_t i = 0; i < n; i++) {
        if (!failed) {
            failed = run_file(names[i]);
            (*count)++;
        }
        free(names[i]);
    }
    free(names);
    return failed;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s FILE-OR-FOLDER...\n", argv[0]);
        return 2;
    }
    size_t count = 0;
    for (int i = 1; i < argc; i++) {
        struct stat st;
        if (stat(argv[i], &st) != 0) {
            perror(argv[i]);
            return 1;
        }
        int failed;
        if (S_ISDIR(st.st_mode)) {
            failed = run_dir(argv[i], &count);
        } else {
            failed = run_file(argv[i]);
            count++;
        }
        if (failed)
            return 1;
    }
    if (count == 0) {
        fprintf(stderr, "%s: no input to replay\n", argv[0]);
        return 1;
    }
    printf("%zu inputs replayed, every rule held\n", count);
    return 0;
}
