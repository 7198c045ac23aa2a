/*
 * pickle.h — a small writer of Python's pickle format (protocol 2), for the snapshots that PyTorch's
 * memory viewers read (pool/api/snapshot.c). It writes plain data only: dicts, lists, tuples, str,
 * int, bool, None and float; never a class, so any unpickler (one that refuses classes too) reads it.
 *
 * The writer appends opcodes to a growing buffer in host memory. Containers are opened and closed in
 * pairs (an empty dict/list then MARK, items, SETITEMS/APPENDS; MARK, items, TUPLE); the writer keeps
 * their depth and what each is, and gp_pickle_finish refuses a document whose containers are not all
 * closed, or a dict with an odd number of items (a key without a value). Host memory running out is
 * remembered (`failed`) and reported once, by gp_pickle_finish: the callers need no check per call.
 *
 * Opcodes used (Lib/pickletools.py names them): PROTO 2, EMPTY_DICT, EMPTY_LIST, MARK, SETITEMS,
 * APPENDS, TUPLE, BININT1/BININT2/BININT, LONG1, BINUNICODE, NEWTRUE/NEWFALSE, NONE, BINFLOAT, STOP.
 * Strings must be UTF-8; bytes that are not valid UTF-8 are written as '?', so the result always loads.
 */
#ifndef GP_BASE_PICKLE_H
#define GP_BASE_PICKLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define GP_PICKLE_MAX_DEPTH 32

typedef struct gp_pickle {
    unsigned char *buf;
    size_t len, cap;
    bool failed;                          /* host memory ran out */
    bool misuse;                          /* containers that do not pair up (see finish) */
    unsigned depth;
    char open[GP_PICKLE_MAX_DEPTH];       /* 'd' dict, 'l' list, 't' tuple */
    size_t items[GP_PICKLE_MAX_DEPTH];    /* values written into each open container */
} gp_pickle;

/* Starts a document (PROTO 2). */
void gp_pickle_init(gp_pickle *pk);
/* Frees the buffer (also after finish, once the bytes are used). */
void gp_pickle_free(gp_pickle *pk);

void gp_pickle_dict(gp_pickle *pk);       /* opens a dict: then key, value, key, value, ... */
void gp_pickle_list(gp_pickle *pk);       /* opens a list */
void gp_pickle_tuple(gp_pickle *pk);      /* opens a tuple */
void gp_pickle_close(gp_pickle *pk);      /* closes the innermost open container */

void gp_pickle_int(gp_pickle *pk, int64_t v);
void gp_pickle_uint(gp_pickle *pk, uint64_t v);
void gp_pickle_str(gp_pickle *pk, const char *s);
void gp_pickle_strn(gp_pickle *pk, const char *s, size_t n);
void gp_pickle_bool(gp_pickle *pk, bool v);
void gp_pickle_none(gp_pickle *pk);
void gp_pickle_float(gp_pickle *pk, double v);

/* dict helpers: a str key then the value */
void gp_pickle_key(gp_pickle *pk, const char *key);

/*
 * Ends the document (STOP). 0 with the bytes in pk->buf[0..pk->len); -1 when host memory ran out
 * or the containers do not pair up (message in `why`, which the caller turns into an error).
 */
int gp_pickle_finish(gp_pickle *pk, const char **why);

#endif /* GP_BASE_PICKLE_H */
