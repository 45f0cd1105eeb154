/*
 * ctest_opts.c — libmuster's sized option structs (muster.h, "option
 * structs") against a real head: a program built against an older muster.h
 * keeps working with this library, and a struct that was never set up is
 * refused with the init to call.
 *
 * An "old caller" is simulated by a local struct type with the layout of an
 * option struct before its last field was added, passed with its own size,
 * as a program compiled against that header would pass it.  Behind it lies a
 * canary: the init must not write it and a call must not read it (a canary
 * that a call read as the missing field would be refused, or would show in
 * what the head stored).  Starts `$MUSTER_BIN head` on a temporary data dir
 * (MUSTER_TEST_URL and MUSTER_TEST_TOKEN: a head started by hand).  Ends
 * with "N passed, M failed".
 */
#include "ctest_util.h"

#include <stddef.h>

#define TOKEN "ctest-token-0123456789"

/* The canary's bytes: as an int64_t it is negative and not -1 or -2, so no
 * option takes it for a default or a sentinel. */
#define CANARY_BYTE 0xA5

/* ---- the structs as programs built before their last field saw them ------------------ */

/* muster_pool_opts_t without request_timeout_ms. */
typedef struct {
  size_t size;
  const char *url, *token, *queue, *init_data, *session;
  int create_queue, cleanup_on_exit;
  int64_t timeout_ms, heartbeat_ms;
  int keep_session;
} old_pool_opts_t;

/* muster_queue_opts_t without keep_done_ms. */
typedef struct {
  size_t size;
  int64_t lease_ms, max_attempts, backoff_ms, backoff_max_ms, max_flags;
  const char *next;
} old_queue_opts_t;

/* muster_loader_opts_t without head_wait_ms. */
typedef struct {
  size_t size;
  const muster_iter_config_t *config;
  uint32_t rank;
  const char *url, *token, *name, *checkpoint;
  size_t prefetch, blocks_per_request;
  muster_load_fn load;
  muster_sample_free_fn free_sample;
  void *user;
} old_loader_opts_t;

/* muster_worker_opts_t without instance. */
typedef struct {
  size_t size;
  const char *nickname;
  const char *const *queues;
  const char *node, *labels;
  int64_t timeout_ms;
} old_worker_opts_t;

/* Each old struct is a prefix of the new one that ends before the new
 * field, so its canary lies where a whole-struct write would put it. */
#define PREFIX_OF(old_t, new_t, last, added)                                                       \
  _Static_assert(offsetof(old_t, last) == offsetof(new_t, last) &&                                 \
                     sizeof(old_t) <= offsetof(new_t, added),                                      \
                 #old_t " is " #new_t " before " #added)
PREFIX_OF(old_pool_opts_t, muster_pool_opts_t, keep_session, request_timeout_ms);
PREFIX_OF(old_queue_opts_t, muster_queue_opts_t, next, keep_done_ms);
PREFIX_OF(old_loader_opts_t, muster_loader_opts_t, user, head_wait_ms);
PREFIX_OF(old_worker_opts_t, muster_worker_opts_t, timeout_ms, instance);

static int canary_intact(const unsigned char *canary, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (canary[i] != CANARY_BYTE)
      return 0;
  return 1;
}

/* An old struct followed by a canary, all of it CANARY_BYTE; `init_sized`
 * given the old size must set the old fields and write nothing past them. */
#define CHECK_INIT_OLD(old_t, new_t, init_sized, defaults_ok)                                      \
  do {                                                                                             \
    struct {                                                                                       \
      old_t opts;                                                                                  \
      unsigned char canary[32];                                                                    \
    } s;                                                                                           \
    memset(&s, CANARY_BYTE, sizeof s);                                                             \
    init_sized((new_t *)(void *)&s.opts, sizeof s.opts);                                           \
    const old_t *o = &s.opts;                                                                      \
    (void)o;                                                                                       \
    CHECK(s.opts.size == sizeof s.opts && (defaults_ok));                                          \
    CHECK(canary_intact(s.canary, sizeof s.canary));                                               \
  } while (0)

/* The init of an old caller writes the defaults it knows and nothing past
 * its struct (the init wrote sizeof the library's struct: a program built
 * against the older header had its next variable overwritten). */
static void test_init_old_caller(void) {
  CHECK_INIT_OLD(old_pool_opts_t, muster_pool_opts_t, muster_pool_opts_init_sized,
                 o->create_queue == 1 && o->heartbeat_ms == -1 && o->url == NULL);
  CHECK_INIT_OLD(old_queue_opts_t, muster_queue_opts_t, muster_queue_opts_init_sized,
                 o->lease_ms == -1 && o->max_flags == -1 && o->next == NULL);
  CHECK_INIT_OLD(old_loader_opts_t, muster_loader_opts_t, muster_loader_opts_init_sized,
                 o->blocks_per_request == 2 && o->config == NULL);
  CHECK_INIT_OLD(old_worker_opts_t, muster_worker_opts_t, muster_worker_opts_init_sized,
                 o->timeout_ms == -1 && o->nickname == NULL);
  /* A size too short to hold the size member: nothing at all is written. */
  unsigned char bytes[8];
  memset(bytes, CANARY_BYTE, sizeof bytes);
  muster_pool_opts_init_sized((muster_pool_opts_t *)(void *)bytes, 4);
  CHECK(canary_intact(bytes, sizeof bytes));
  muster_pool_opts_init_sized(NULL, sizeof(muster_pool_opts_t)); /* no crash */
}

/* A normal caller: the size is its struct's, and the newest field counts. */
static void test_normal_caller(muster_client_t *c) {
  muster_pool_opts_t opts;
  ctest_pool_opts(&opts, head_url, "co-normal");
  CHECK(opts.size == sizeof opts && opts.request_timeout_ms == 0 && opts.create_queue == 1);
  opts.request_timeout_ms = 30000;
  muster_pool_t *pool = NULL;
  char *message = NULL;
  CHECK_ERR(NULL, muster_pool_open(&opts, &pool, &message), MUSTER_OK);
  CHECK(pool != NULL && message == NULL);
  muster_pool_close(pool);
  muster_queue_opts_t qo;
  muster_queue_opts_init(&qo);
  CHECK(qo.size == sizeof qo && qo.keep_done_ms == -1);
  qo.keep_done_ms = 5000;
  char *json = NULL;
  CHECK_OK(c, muster_queue_put(c, "co-normal-q", &qo, &json));
  CHECK(contains(json, "\"keep_done_ms\":5000"));
  muster_free(json);
}

/* An old caller's pool: request_timeout_ms takes its default.  Read from the
 * canary it would be negative, and open would refuse it. */
static void test_old_pool(muster_client_t *c) {
  struct {
    old_pool_opts_t opts;
    unsigned char canary[8];
  } s;
  memset(&s, CANARY_BYTE, sizeof s);
  muster_pool_opts_init_sized((muster_pool_opts_t *)(void *)&s.opts, sizeof s.opts);
  s.opts.url = head_url;
  s.opts.token = head_token;
  s.opts.queue = "co-old-pool";
  muster_pool_t *pool = NULL;
  char *message = NULL;
  CHECK_ERR(NULL,
            muster_pool_open((const muster_pool_opts_t *)(const void *)&s.opts, &pool, &message),
            MUSTER_OK);
  if (message != NULL)
    fprintf(stderr, "old pool: %s\n", message);
  CHECK(pool != NULL && canary_intact(s.canary, sizeof s.canary));
  CHECK_OK(c, muster_queue_get(c, "co-old-pool", NULL)); /* made with the old create_queue */
  muster_free(message);
  muster_pool_close(pool);
}

/* An old caller's queue: keep_done_ms takes its default (kept for ever),
 * not the 5000 that lies behind the struct. */
static void test_old_queue(muster_client_t *c) {
  struct {
    old_queue_opts_t opts;
    int64_t behind;
  } s;
  memset(&s, CANARY_BYTE, sizeof s);
  muster_queue_opts_init_sized((muster_queue_opts_t *)(void *)&s.opts, sizeof s.opts);
  s.behind = 5000; /* where keep_done_ms is in this library's struct */
  s.opts.max_attempts = 3;
  char *json = NULL;
  CHECK_OK(c, muster_queue_put(c, "co-old-queue",
                               (const muster_queue_opts_t *)(const void *)&s.opts, &json));
  CHECK(contains(json, "\"max_attempts\":3") && contains(json, "\"keep_done_ms\":null"));
  CHECK(s.behind == 5000);
  muster_free(json);
}

/* A program built against a newer header than this library: its struct is
 * longer, and the fields this library does not know are ignored. */
static void test_newer_caller(void) {
  struct {
    muster_pool_opts_t opts;
    int64_t future_field;
  } s;
  muster_pool_opts_init_sized(&s.opts, sizeof s);
  CHECK(s.opts.size == sizeof s && s.opts.create_queue == 1);
  s.future_field = -7;
  s.opts.url = head_url;
  s.opts.token = head_token;
  s.opts.queue = "co-newer";
  muster_pool_t *pool = NULL;
  CHECK_ERR(NULL, muster_pool_open(&s.opts, &pool, NULL), MUSTER_OK);
  muster_pool_close(pool);
}

/* The struct a registration fills, in a program built against a newer
 * header: the library writes its own fields and nothing past them. */
static void test_newer_registration(muster_client_t *c) {
  struct {
    muster_worker_reg_t reg;
    unsigned char canary[8];
  } s;
  memset(&s, CANARY_BYTE, sizeof s);
  muster_worker_reg_init_sized(&s.reg, sizeof s);
  CHECK(s.reg.size == sizeof s && s.reg.name == NULL && canary_intact(s.canary, sizeof s.canary));
  CHECK_OK(c, muster_worker_register_full(c, NULL, &s.reg));
  CHECK(s.reg.id > 0 && s.reg.timeout_ms > 0 && s.reg.name != NULL && s.reg.size == sizeof s);
  CHECK(canary_intact(s.canary, sizeof s.canary));
  muster_worker_reg_clear(&s.reg);
}

/* MUSTER_INVALID with `message` naming `init`. */
static void check_refused(muster_err_t err, const char *message, const char *init, int line) {
  char what[600];
  snprintf(what, sizeof what, "refused naming %s (got %s, said: %s)", init, muster_err_name(err),
           message ? message : "");
  check(err == MUSTER_INVALID && contains(message, init) && contains(message, "size is"), what,
        line);
}

#define CHECK_REFUSED(c, call, init)                                                               \
  do {                                                                                             \
    muster_err_t err_ = (call);                                                                    \
    check_refused(err_, muster_client_message(c), (init), __LINE__);                               \
  } while (0)

/* Structs zeroed with {0} (never set up) are refused by every call that
 * reads options, the message naming the init, before anything is sent. */
static void test_zero_size_client_calls(muster_client_t *c) {
  muster_queue_opts_t qo = {0};
  qo.max_attempts = 3;
  CHECK_REFUSED(c, muster_queue_put(c, "co-zero", &qo, NULL), "muster_queue_opts_init");
  CHECK_ERR(c, muster_queue_get(c, "co-zero", NULL), MUSTER_QUEUE_NOT_FOUND);
  muster_worker_opts_t wo = {0};
  int64_t id = 0;
  CHECK_REFUSED(c, muster_worker_register(c, &wo, &id, NULL), "muster_worker_opts_init");
  /* The struct a registration fills is refused alike when not set up: the
   * library could not know how much of it the caller has. */
  muster_worker_reg_t reg = {0};
  CHECK_REFUSED(c, muster_worker_register_full(c, NULL, &reg), "muster_worker_reg_init");
  CHECK(reg.id == 0 && reg.name == NULL);
  reg.size = sizeof reg.size + 1;
  CHECK_REFUSED(c, muster_worker_register_full(c, NULL, &reg), "muster_worker_reg_init");
  CHECK(id == 0);
  muster_session_opts_t so = {0};
  so.queue = "co-normal-q";
  CHECK_REFUSED(c, muster_session_create(c, &so, NULL, NULL), "muster_session_opts_init");
  muster_iter_config_t cfg = {0};
  cfg.num_samples = 10;
  CHECK_REFUSED(c, muster_iter_create(c, "co-zero", &cfg, NULL, -1, NULL),
                "muster_iter_config_init");
  muster_shared_opts_t sh = {0};
  CHECK_REFUSED(c, muster_shared_put_fd(c, "co", "blob", 0, 0, &sh, NULL),
                "muster_shared_opts_init");
  CHECK_REFUSED(c, muster_shared_get_fd(c, "co", "blob", 1, &sh, NULL), "muster_shared_opts_init");
  /* Set up by something else than init, shorter than the first version. */
  muster_queue_opts_init(&qo);
  qo.size = sizeof qo.size;
  CHECK_REFUSED(c, muster_queue_put(c, "co-zero", &qo, NULL), "muster_queue_opts_init");
  CHECK(contains(muster_client_message(c), "less than its first version's"));
}

/* The opens say it in *message: a pool's and a loader's options, and the
 * configuration a loader's options point at. */
static void test_zero_size_opens(muster_client_t *c) {
  muster_pool_opts_t po = {0};
  po.url = head_url;
  po.token = head_token;
  po.queue = "co-zero-pool";
  muster_pool_t *pool = NULL;
  char *message = NULL;
  muster_err_t err = muster_pool_open(&po, &pool, &message);
  check_refused(err, message, "muster_pool_opts_init", __LINE__);
  CHECK(pool == NULL);
  CHECK_ERR(c, muster_queue_get(c, "co-zero-pool", NULL), MUSTER_QUEUE_NOT_FOUND);
  muster_free(message);

  muster_iter_config_t cfg;
  muster_iter_config_init(&cfg);
  cfg.num_samples = 10;
  muster_loader_opts_t lo = {0};
  lo.config = &cfg;
  muster_loader_t *loader = NULL;
  err = muster_loader_open(&lo, &loader, &message);
  check_refused(err, message, "muster_loader_opts_init", __LINE__);
  CHECK(loader == NULL);
  muster_free(message);
  muster_iter_config_t zero_cfg = {0};
  zero_cfg.num_samples = 10;
  muster_loader_opts_init(&lo);
  lo.config = &zero_cfg;
  err = muster_loader_open(&lo, &loader, &message);
  check_refused(err, message, "muster_iter_config_init", __LINE__);
  CHECK(contains(message, "opts.config"));
  muster_free(message);
  lo.config = &cfg; /* set up properly, the same open works */
  loader = ctest_loader_open(&lo);
  CHECK(loader != NULL);
  muster_loader_close(loader);
}

int main(int argc, char **argv) {
  test_init_old_caller();
  if (!ctest_use_test_url(TOKEN) &&
      ctest_head_start(muster_bin(argv[0]), "/tmp/muster-ctest-opts-XXXXXX", TOKEN, NULL) != 0)
    return ctest_head_failed();
  muster_client_t *client = connect_head(head_token);
  test_normal_caller(client);
  test_old_pool(client);
  test_old_queue(client);
  test_newer_caller();
  test_newer_registration(client);
  test_zero_size_client_calls(client);
  test_zero_size_opens(client);
  muster_client_free(client);
  ctest_head_stop();
  return ctest_report();
}
