/*
 * progress.c — the progress bar that `muster map` and `muster queue wait`
 * draw on stderr when it is a terminal: one line redrawn in place ("\r" and
 * erase to its end), at most ten times a second, so that a pipe or a log
 * never sees it.  The commands decide whether it is on (cli_bar_t.enabled).
 */
#include "cli/cli.h"

#include <time.h>

#define BAR_WIDTH 30      /* characters of the bar */
#define BAR_REDRAW_MS 100 /* at most ten redraws a second */

int64_t cli_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void cli_bar_draw(cli_bar_t *bar, size_t done, size_t total, int eta, const char *tail, int force) {
  int64_t now = cli_now_ms();
  if (!bar->enabled || (!force && now - bar->drawn_ms < BAR_REDRAW_MS))
    return;
  bar->drawn_ms = now;
  double secs = (double)(now - bar->started_ms) / 1000.0;
  double rate = secs > 0 ? (double)done / secs : 0;
  int filled = total ? (int)((double)BAR_WIDTH * (double)done / (double)total) : BAR_WIDTH;
  char cells[BAR_WIDTH + 1], left[32] = "--";
  for (int i = 0; i < BAR_WIDTH; i++)
    cells[i] = i < filled ? '#' : '-';
  cells[BAR_WIDTH] = '\0';
  if (rate > 0) {
    long secs_left = (long)((double)(total - done) / rate + 0.5);
    snprintf(left, sizeof left, "%ldm%02lds", secs_left / 60, secs_left % 60);
  }
  fprintf(stderr, "\r[%s] %zu/%zu %3d%%  %.1f/s", cells, done, total,
          total ? (int)(100.0 * (double)done / (double)total) : 100, rate);
  if (eta)
    fprintf(stderr, "  ETA %s", left);
  if (tail && tail[0])
    fprintf(stderr, "  %s", tail);
  fputs("  \x1b[K", stderr);
  fflush(stderr);
  bar->shown = 1;
}

void cli_bar_clear(const cli_bar_t *bar) {
  if (bar->enabled)
    fputs("\r\x1b[K", stderr);
}
