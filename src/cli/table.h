/*
 * table.h — plain-text tables for the CLI's listings.
 */
#ifndef MUSTER_CLI_TABLE_H
#define MUSTER_CLI_TABLE_H

#include <stddef.h>
#include <stdio.h>

#define TABLE_MAX_COLS 16

typedef struct {
  int ncols;
  const int *right_align; /* per column, non-zero: right-aligned; may be NULL */
  char **cells;           /* nrows * ncols copies, row-major; the first row is the header */
  size_t nrows, cap;
} cli_table_t;

/* Starts a table with a header row; `right_align` (may be NULL) stays the caller's. */
void table_init(cli_table_t *table, int ncols, const char *const *headers, const int *right_align);
/* Appends a row of `ncols` cells (copied; NULL prints empty).  -1 on no memory. */
int table_add(cli_table_t *table, const char *const *cells);
void table_print(const cli_table_t *table, FILE *out);
void table_free(cli_table_t *table);

#endif
