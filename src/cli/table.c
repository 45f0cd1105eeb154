/*
 * table.c — plain-text tables for the CLI's listings (queue ls, tasks ls).
 *
 * Cells are copied in; columns are as wide as their widest cell, separated by
 * two spaces, the last column left unpadded.  Numbers are right-aligned when
 * the table says so, so counts line up.
 */
#include "cli/table.h"

#include <stdlib.h>
#include <string.h>

void table_init(cli_table_t *table, int ncols, const char *const *headers, const int *right_align) {
  memset(table, 0, sizeof *table);
  table->ncols = ncols;
  table->right_align = right_align;
  table_add(table, headers);
}

int table_add(cli_table_t *table, const char *const *cells) {
  if (table->nrows == table->cap) {
    size_t cap = table->cap ? table->cap * 2 : 16;
    char **grown = realloc(table->cells, cap * (size_t)table->ncols * sizeof *grown);
    if (grown == NULL)
      return -1;
    table->cells = grown;
    table->cap = cap;
  }
  char **row = table->cells + table->nrows * (size_t)table->ncols;
  for (int c = 0; c < table->ncols; c++)
    row[c] = strdup(cells[c] ? cells[c] : "");
  table->nrows++;
  return 0;
}

void table_print(const cli_table_t *table, FILE *out) {
  int widths[TABLE_MAX_COLS] = {0};
  for (size_t r = 0; r < table->nrows; r++)
    for (int c = 0; c < table->ncols && c < TABLE_MAX_COLS; c++) {
      const char *cell = table->cells[r * (size_t)table->ncols + c];
      int len = cell ? (int)strlen(cell) : 0;
      if (len > widths[c])
        widths[c] = len;
    }
  for (size_t r = 0; r < table->nrows; r++) {
    for (int c = 0; c < table->ncols && c < TABLE_MAX_COLS; c++) {
      const char *cell = table->cells[r * (size_t)table->ncols + c];
      int last = c == table->ncols - 1;
      int right = table->right_align && table->right_align[c];
      if (right)
        fprintf(out, "%*s", widths[c], cell ? cell : "");
      else
        fprintf(out, "%-*s", last ? 0 : widths[c], cell ? cell : "");
      fputs(last ? "\n" : "  ", out);
    }
  }
}

void table_free(cli_table_t *table) {
  for (size_t i = 0; i < table->nrows * (size_t)table->ncols; i++)
    free(table->cells[i]);
  free(table->cells);
  memset(table, 0, sizeof *table);
}
