/*
 * list.h — the one intrusive doubly linked list of the pool (in the manner of jemalloc's ql.h): any
 * struct with two pointer fields to its own type is a node, and the caller names those fields, so that
 * one struct can sit on several lists (a block is on its segment's address chain through prev/next and
 * on a free or pending list through list_prev/list_next).
 *
 * A list is a head pointer (first node, NULL when empty) and, for lists appended to, a tail pointer
 * (last node). Invariants: head == NULL iff tail == NULL; head->prev == NULL, tail->next == NULL;
 * n->next->prev == n for every node but the last. Macros, so that they work for every node type and
 * cost what the hand-written code cost: every argument must be an lvalue without side effects (they
 * are evaluated more than once). None of them clears the removed node's fields.
 */
#ifndef GP_LIST_H
#define GP_LIST_H

#include <stddef.h>

/* Makes `node` the first of the list at `head` (a list without a tail). */
#define GP_LIST_PUSH(head, node, prev, next)                                                                   \
    do {                                                                                                       \
        (node)->prev = NULL;                                                                                   \
        (node)->next = (head);                                                                                 \
        if ((node)->next != NULL)                                                                              \
            (node)->next->prev = (node);                                                                       \
        (head) = (node);                                                                                       \
    } while (0)

/* Takes `node` out of the list at `head` (a list without a tail). */
#define GP_LIST_REMOVE(head, node, prev, next)                                                                 \
    do {                                                                                                       \
        if ((node)->prev != NULL)                                                                              \
            (node)->prev->next = (node)->next;                                                                 \
        else                                                                                                   \
            (head) = (node)->next;                                                                             \
        if ((node)->next != NULL)                                                                              \
            (node)->next->prev = (node)->prev;                                                                 \
    } while (0)

/* Makes `node` the last of the list (head, tail). */
#define GP_LIST_APPEND(head, tail, node, prev, next)                                                           \
    do {                                                                                                       \
        (node)->prev = (tail);                                                                                 \
        (node)->next = NULL;                                                                                   \
        if ((tail) != NULL)                                                                                    \
            (tail)->next = (node);                                                                             \
        else                                                                                                   \
            (head) = (node);                                                                                   \
        (tail) = (node);                                                                                       \
    } while (0)

/* Takes `node` out of the list (head, tail). */
#define GP_LIST_UNLINK(head, tail, node, prev, next)                                                           \
    do {                                                                                                       \
        if ((node)->prev != NULL)                                                                              \
            (node)->prev->next = (node)->next;                                                                 \
        else                                                                                                   \
            (head) = (node)->next;                                                                             \
        if ((node)->next != NULL)                                                                              \
            (node)->next->prev = (node)->prev;                                                                 \
        else                                                                                                   \
            (tail) = (node)->prev;                                                                             \
    } while (0)

#endif /* GP_LIST_H */
