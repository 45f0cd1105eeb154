/*
 * table.c — plain-text tables for the CLI's listings (queue ls, tasks ls).
 *
 * Cells are copied in; columns are as wide as their widest cell, separated by
 * two spaces, the last column left unpadded.  Numbers are right-aligned when
 * the table says so, so counts line up.
 *
 * A cell may hold what any worker sent (its progress, a task's error; through
 * the DistCompute routes, anyone who reaches the head, no token needed), and
 * the table goes to an operator's terminal: control characters are shown as
 * '?' (as ls -q shows them), so that no cell moves the cursor, clears the
 * screen, retitles the window or starts a line that looks like another row.
 */
#include "cli/table.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

void table_init(cli_table_t *table, int ncols, const char *const *headers, const int *right_align) {
  memset(table, 0, sizeof *table);
  table->ncols = ncols;
  table->right_align = right_align;
  table_add(table, headers);
}

/* A copy of `text` (NULL: "") with each control character, C0 and DEL as
 * bytes and C1 (U+0080 to U+009F, which some terminals obey as ESC
 * sequences) as its two UTF-8 bytes, replaced by one '?'.  The caller frees
 * it; NULL when memory ran out. */
static char *table_cell_copy(const char *text) {
  const unsigned char *in = (const unsigned char *)(text ? text : "");
  char *out = malloc(strlen((const char *)in) + 1), *o = out;
  if (out == NULL)
    return NULL;
  for (; *in; in++) {
    bool c1 = in[0] == 0xc2 && in[1] >= 0x80 && in[1] <= 0x9f;
    *o++ = *in < 0x20 || *in == 0x7f || c1 ? '?' : (char)*in;
    in += c1; /* the C1 character's second byte */
  }
  *o = '\0';
  return out;
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
    row[c] = table_cell_copy(cells[c]);
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
