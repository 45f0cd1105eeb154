/*
 * cache_dirs.c — the node cache's directory: its layout, what an agent takes
 * over from the one before it, and the cleaning of the cache's own
 * directories.
 *
 * DIR/SCOPE/NAME@LEVEL@CHECKSUM are the cached levels.  The cache's own names
 * start with '@', which no scope can hold, so that no scope shares them:
 * DIR/@tmp (fetches in progress: what is there at the start is a previous
 * agent's, emptied), DIR/@links (one directory PID-XXXXXX per worker, for the
 * levels it hard-links: a worker's goes when it ends, and at the start those
 * of workers no longer running) and DIR/@agent.lock (cache_lock.c).
 *
 * An older agent kept its own in DIR/tmp and DIR/links, which are also the
 * directories of the scopes `tmp` and `links`: it stored a level of scope
 * `tmp` among its fetches and removed it at its next start, and skipped both
 * scopes when it took a directory over.  An agent started on such a dir
 * removes what the older one left there (the fetch-XXXXXX files of DIR/tmp,
 * the directories in DIR/links of workers no longer running), as the older
 * agent did at its start, and takes the rest as any scope's (cached levels of
 * `tmp` and `links` are taken over, checked on first use).  Neither rule can
 * take a level: a level's file name has two '@', and is a file, not a
 * directory.  It does so at every start, so a dir an older agent used again
 * later is cleaned the same way.  The other way round cannot be helped: an
 * older agent reads no marker, and empties DIR/tmp (the scope `tmp`'s cached
 * levels, copies fetched again) as it starts; no layout of ours keeps that
 * name from a scope without a special case in every path, for copies only
 * (docs/node.md, "Going back to an earlier agent").
 *
 * A cache is a cache: nothing in it is the only copy, so what an agent left
 * behind can go.  Nothing outside DIR is touched: each directory in it is
 * opened relative to its parent without following a symbolic link
 * (O_NOFOLLOW), removals are relative to the directory they are in, and a
 * link where a file or directory of the cache's is expected is left as it is,
 * neither followed nor taken over.  DIR itself may be a link (the operator's
 * choice of --cache-dir).
 */
#include "node/cache.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define CACHE_OLD_TMP_DIR "tmp"      /* an older agent's fetches in progress */
#define CACHE_OLD_LINKS_DIR "links"  /* an older agent's workers' link directories */
#define CACHE_FETCH_PREFIX "fetch-"  /* a fetch's file: fetch-XXXXXX (mkostemp) */
#define CACHE_FETCH_NAME_LEN (6 + 6) /* strlen("fetch-XXXXXX") */

int cache_make_dir(const cache_t *c, const char *sub) {
  char path[1024];
  snprintf(path, sizeof path, "%s", c->dir);
  for (char *p = path + 1; *p; p++) {
    if (*p != '/')
      continue;
    *p = '\0';
    if (mkdir(path, 0755) != 0 && errno != EEXIST)
      return -1;
    *p = '/';
  }
  if (mkdir(path, 0755) != 0 && errno != EEXIST)
    return -1;
  if (sub == NULL)
    return 0;
  snprintf(path, sizeof path, "%s/%s", c->dir, sub);
  return mkdir(path, 0755) != 0 && errno != EEXIST ? -1 : 0;
}

int cache_links_dir(cache_t *c, char *buf, size_t size) {
  if (cache_make_dir(c, CACHE_LINKS_DIR) != 0)
    return -1;
  snprintf(buf, size, "%s/" CACHE_LINKS_DIR, c->dir);
  return 0;
}

/* ---- walking without following links ------------------------------------- */

/* Directory `name` in directory `at`, opened for reading; NULL (errno) when
 * it is not there or not a directory, a symbolic link to one included. */
static DIR *cache_dir_open(int at, const char *name) {
  int fd = openat(at, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
  if (d == NULL && fd >= 0)
    close(fd);
  return d;
}

/* The next entry of `d` but "." and "..", or NULL at the end. */
static const char *cache_dir_next(DIR *d) {
  struct dirent *de;
  while ((de = readdir(d)) != NULL)
    if (strcmp(de->d_name, ".") != 0 && strcmp(de->d_name, "..") != 0)
      return de->d_name;
  return NULL;
}

/* The type (S_IFREG, S_IFDIR, S_IFLNK...) of `name` in directory `d`, not
 * following a link; 0 when it cannot be looked at. */
static mode_t cache_dir_kind(DIR *d, const char *name) {
  struct stat st;
  return fstatat(dirfd(d), name, &st, AT_SYMLINK_NOFOLLOW) == 0 ? st.st_mode & S_IFMT : 0;
}

/* Removes every entry of directory `name` in `at` but directories: files,
 * and links as names (never what they point to). */
static void cache_dir_empty(int at, const char *name) {
  DIR *d = cache_dir_open(at, name);
  const char *entry;
  while (d && (entry = cache_dir_next(d)) != NULL)
    unlinkat(dirfd(d), entry, 0); /* a directory stays (EISDIR): none is ours */
  if (d)
    closedir(d);
}

/* ---- the cache's own directories ----------------------------------------- */

/* The pid of a worker's link directory named `name` (PID-XXXXXX), or 0. */
static pid_t cache_worker_dir_pid(const char *name) {
  char *end;
  long pid = strtol(name, &end, 10);
  return name[0] >= '0' && name[0] <= '9' && *end == '-' && pid > 0 && pid == (pid_t)pid
             ? (pid_t)pid
             : 0;
}

/* Removes the workers' link directories in directory `sub` of `top`: those
 * of worker `pid`, or (pid 0) of every worker no longer running.  Only real
 * directories named PID-XXXXXX go, with the links in them. */
static void cache_drop_worker_dirs(int top, const char *sub, pid_t pid) {
  DIR *d = cache_dir_open(top, sub);
  const char *entry;
  while (d && (entry = cache_dir_next(d)) != NULL) {
    pid_t owner = cache_worker_dir_pid(entry);
    if (owner == 0 || (pid != 0 && owner != pid) || cache_dir_kind(d, entry) != S_IFDIR)
      continue;
    if (pid == 0 && (kill(owner, 0) == 0 || errno == EPERM))
      continue; /* still running: it removes its own when it ends */
    cache_dir_empty(dirfd(d), entry);
    unlinkat(dirfd(d), entry, AT_REMOVEDIR);
  }
  if (d)
    closedir(d);
}

void cache_forget_worker(cache_t *c, pid_t pid) {
  int top = open(c->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (top < 0)
    return; /* no cache dir (yet, or any more): nothing linked */
  cache_drop_worker_dirs(top, CACHE_LINKS_DIR, pid);
  close(top);
}

/* Removes an older agent's fetch files from DIR/tmp, which is the directory
 * of the scope `tmp` now: regular files named fetch-XXXXXX, which no level's
 * file is (it has two '@'). */
static void cache_drop_old_fetches(int top) {
  DIR *d = cache_dir_open(top, CACHE_OLD_TMP_DIR);
  const char *entry;
  while (d && (entry = cache_dir_next(d)) != NULL)
    if (strlen(entry) == CACHE_FETCH_NAME_LEN &&
        strncmp(entry, CACHE_FETCH_PREFIX, strlen(CACHE_FETCH_PREFIX)) == 0 &&
        strchr(entry, '@') == NULL && cache_dir_kind(d, entry) == S_IFREG)
      unlinkat(dirfd(d), entry, 0);
  if (d)
    closedir(d);
}

/* ---- taking a directory over ---------------------------------------------- */

/* Takes over the cached levels in scope directory `scope` of `top`: its
 * regular files whose names parse (cache_adopt), those of a blob whose name
 * starts with '.' too. */
static void cache_adopt_scope(cache_t *c, int top, const char *scope) {
  DIR *d = cache_dir_open(top, scope);
  const char *entry;
  while (d && (entry = cache_dir_next(d)) != NULL) {
    struct stat st;
    if (fstatat(dirfd(d), entry, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode))
      cache_adopt(c, scope, entry, (int64_t)st.st_size);
  }
  if (d)
    closedir(d);
}

void cache_take_over(cache_t *c) {
  int top = open(c->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (top < 0)
    return; /* made on first use */
  cache_dir_empty(top, CACHE_TMP_DIR);
  cache_drop_worker_dirs(top, CACHE_LINKS_DIR, 0);
  cache_drop_old_fetches(top);
  cache_drop_worker_dirs(top, CACHE_OLD_LINKS_DIR, 0);
  DIR *d = fdopendir(top); /* owns `top` from here */
  if (d == NULL) {
    close(top);
    return;
  }
  const char *entry;
  while ((entry = cache_dir_next(d)) != NULL)
    if (cache_valid_name(entry, strlen(entry)) && cache_dir_kind(d, entry) == S_IFDIR)
      cache_adopt_scope(c, dirfd(d), entry);
  closedir(d);
}
