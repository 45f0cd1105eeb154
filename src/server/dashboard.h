/*
 * dashboard.h — the web dashboard's routes: the embedded static files
 * (web/, built into the binary by web/embed.cmake), the JSON the page needs
 * beyond the rest of the API (throughput), and GET /metrics.
 *
 * The page itself holds no data and is served without a token; it asks the
 * user for one and reads only the JSON API with it.
 */
#ifndef MUSTER_SERVER_DASHBOARD_H
#define MUSTER_SERVER_DASHBOARD_H

#include <stddef.h>

#include "http.h"

/* One embedded file: its name under web/, its bytes (NUL-terminated, the NUL
 * not counted) and length. */
typedef struct {
  const char *name;
  const unsigned char *data;
  size_t len;
} dashboard_asset_t;

/* Generated at build time; ends with a row whose name is NULL. */
extern const dashboard_asset_t dashboard_assets[];

/* The embedded file called `name`, or NULL. */
const dashboard_asset_t *dashboard_asset(const char *name);

/* GET / and the DistCompute pages: the dashboard's HTML. */
void dashboard_h_index(http_req_t *r);
/* GET /dashboard/{file}: a script, style sheet or image of the page. */
void dashboard_h_asset(http_req_t *r);
/* GET /compat/distcompute/{pipeline}, .../{pipeline}/ and .../{pipeline}/leaderboard:
 * the page, which shows that pipeline. */
void dashboard_h_compat_page(http_req_t *r);
/* GET /compat/distcompute/{pipeline}/worker/{stage}/{name}: the page, on that worker. */
void dashboard_h_compat_worker(http_req_t *r);
/* GET /v1/throughput?seconds=N: completions per second, per queue. */
void dashboard_h_throughput(http_req_t *r);
/* GET /metrics: Prometheus text; a read token unless --metrics-public. */
void dashboard_h_metrics(http_req_t *r);

#endif
