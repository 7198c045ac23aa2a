/*
 * json_text.h — writing a string as a JSON string literal (quotes, backslashes and control characters
 * escaped), for the plan command's --json output (json_text.c).
 */
#ifndef GP_CLI_JSON_TEXT_H
#define GP_CLI_JSON_TEXT_H

#include <stdio.h>

void gp_json_string(FILE *f, const char *s);

#endif /* GP_CLI_JSON_TEXT_H */
