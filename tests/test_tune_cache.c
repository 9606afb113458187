/* tests/test_tune_cache.c: the autotune cache on disk (gen/tune_cache.c):
 * where the directory is (explicit, MG_TUNE_CACHE, XDG_CACHE_HOME, HOME),
 * the key (stable, every part counts, spec_name does not), entry file
 * names, JSON string escaping, atomic writes (content, mode, no temporary
 * left, replacing an entry, errors) and reading the entries back (only
 * *.json, sorted, a missing directory is empty). CPU only. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <dirent.h>

#include "tap.h"
#include "tune_cache.h"

static char tmpdir[256];

static int count_files(const char *dir, const char *prefix)
{
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL)
        if (strncmp(e->d_name, prefix, strlen(prefix)) == 0)
            n++;
    if (d)
        closedir(d);
    return n;
}

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

int main(void)
{
    tap_plan(30);
    snprintf(tmpdir, sizeof tmpdir, "%s/mg-tc.XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(tmpdir)) {
        tap_skip_all("cannot create a temporary directory");
    }
    char *err = NULL, *d;

    /* ---- directory resolution ---- */
    setenv("MG_TUNE_CACHE", "/x/mg", 1);
    setenv("XDG_CACHE_HOME", "/x/xdg", 1);
    setenv("HOME", "/x/home", 1);
    d = tc_dir("/explicit", &err);
    tap_is_str(d, "/explicit", "explicit directory first");
    free(d);
    d = tc_dir(NULL, &err);
    tap_is_str(d, "/x/mg", "then MG_TUNE_CACHE");
    free(d);
    unsetenv("MG_TUNE_CACHE");
    d = tc_dir(NULL, &err);
    tap_is_str(d, "/x/xdg/mamba-gen", "then $XDG_CACHE_HOME/mamba-gen");
    free(d);
    setenv("XDG_CACHE_HOME", "relative", 1);
    d = tc_dir(NULL, &err);
    tap_is_str(d, "/x/home/.cache/mamba-gen", "a relative XDG_CACHE_HOME is ignored (XDG spec): ~/.cache/mamba-gen");
    free(d);
    unsetenv("XDG_CACHE_HOME");
    unsetenv("HOME");
    d = tc_dir(NULL, &err);
    tap_ok(d == NULL && err && strstr(err, "MG_TUNE_CACHE"), "no variable set: an error naming MG_TUNE_CACHE");
    free(d);
    free(err);
    err = NULL;

    /* ---- key ---- */
    tc_key_parts k = {"aa", "m", "0.1.0", "tt", "NVIDIA H200", "9.0", "13.0", "13.0"};
    char h1[SHA256_HEX_SIZE], h2[SHA256_HEX_SIZE];
    tc_key(&k, h1);
    tc_key(&k, h2);
    tap_ok(strlen(h1) == 64 && strcmp(h1, h2) == 0, "key: 64 hex digits, stable");
    /* the documented canonical string, hashed independently */
    char ref[SHA256_HEX_SIZE];
    const char *canon = TC_FORMAT "\nspec=aa\ngenerator=0.1.0\ntemplates=tt\ngpu=NVIDIA H200\ncc=9.0\n"
                                  "driver=13.0\nnvrtc=13.0\n";
    sha256_hex(canon, strlen(canon), ref);
    tap_is_str(h1, ref, "key = sha256 of the documented canonical key string");
    tc_key_parts k2 = k;
    k2.spec_name = "other";
    tc_key(&k2, h2);
    tap_is_str(h2, h1, "spec_name is not part of the key");
    const char **fields[] = {&k2.spec, &k2.generator, &k2.templates, &k2.gpu, &k2.cc, &k2.driver, &k2.nvrtc};
    int all_differ = 1;
    for (size_t i = 0; i < sizeof fields / sizeof *fields; i++) {
        k2 = k;
        *fields[i] = "changed";
        tc_key(&k2, h2);
        all_differ &= strcmp(h1, h2) != 0;
    }
    tap_ok(all_differ, "every hashed part changes the key");
    char *name = tc_file_name(&k);
    char want[64];
    snprintf(want, sizeof want, "m-%.16s.json", h1);
    tap_is_str(name, want, "file name SPECNAME-KEY16.json");
    free(name);

    /* ---- JSON strings ---- */
    tc_buf b = {NULL, 0, 0, 0};
    tc_buf_json_str(&b, "a\"b\\c\nd\te\x01 \xc3\xa9");
    tc_buf_printf(&b, " %d ", 42);
    tc_buf_json_str(&b, NULL);
    size_t len = 0;
    char *txt = tc_buf_take(&b, &len);
    tap_is_str(txt, "\"a\\\"b\\\\c\\nd\\te\\u0001 \xc3\xa9\" 42 null", "JSON escaping (quotes, backslash, controls, UTF-8 kept)");
    tap_is_int((long long)len, (long long)strlen(txt), "buffer length");
    free(txt);

    /* ---- atomic write ---- */
    char dir[512];
    snprintf(dir, sizeof dir, "%s/a/b/mamba-gen", tmpdir);
    tap_is_int(tc_write_atomic(dir, "m-1.json", "{\"x\": 1}\n", 9, &err), 0, "write creates missing parents");
    char path[600];
    snprintf(path, sizeof path, "%s/m-1.json", dir);
    tc_files fs;
    struct stat st;
    tap_ok(stat(path, &st) == 0 && st.st_size == 9 && (st.st_mode & 0777) == 0644, "entry written, 9 bytes, mode 0644");
    tap_is_int(count_files(dir, "."), 2, "no temporary file left (only . and ..)");
    tap_is_int(tc_write_atomic(dir, "m-1.json", "{\"x\": 22}\n", 10, &err), 0, "rewrite of the same entry");
    tc_read_all(dir, &fs, &err);
    tap_ok(fs.n == 1 && strcmp(fs.files[0].data, "{\"x\": 22}\n") == 0, "the entry is replaced as a whole");
    tc_files_free(&fs);
    tap_ok(tc_write_atomic(dir, "../evil.json", "x", 1, &err) == -1 && err && strstr(err, "invalid entry name"),
           "a name with a slash is refused");
    free(err);
    err = NULL;
    tap_ok(tc_write_atomic(dir, ".hidden.json", "x", 1, &err) == -1, "a dot name is refused");
    free(err);
    err = NULL;
    char filedir[600];
    snprintf(filedir, sizeof filedir, "%s/m-1.json/sub", dir);
    tap_ok(tc_write_atomic(filedir, "x.json", "x", 1, &err) == -1 && err && strstr(err, "cannot create the directory"),
           "a directory path through a file: clear error");
    free(err);
    err = NULL;
    if (geteuid() != 0) {
        char ro[600];
        snprintf(ro, sizeof ro, "%s/ro", tmpdir);
        mkdir(ro, 0555);
        tap_ok(tc_write_atomic(ro, "x.json", "x", 1, &err) == -1 && err && strstr(err, "cannot create a file"),
               "unwritable directory: clear error");
        tap_is_int(count_files(ro, "."), 2, "unwritable directory: nothing left behind");
        free(err);
        err = NULL;
        chmod(ro, 0755);
    } else {
        tap_skip(2, "running as root: directory permissions are not enforced");
    }

    /* ---- reading ---- */
    snprintf(path, sizeof path, "%s/b-2.json", dir);
    write_file(path, "{}\n");
    snprintf(path, sizeof path, "%s/a-3.json", dir);
    write_file(path, "[]\n");
    snprintf(path, sizeof path, "%s/notes.txt", dir);
    write_file(path, "not an entry\n");
    snprintf(path, sizeof path, "%s/.c-4.json", dir);
    write_file(path, "{}\n");
    snprintf(path, sizeof path, "%s/sub.json", dir);
    mkdir(path, 0755);
    tap_is_int(tc_read_all(dir, &fs, &err), 0, "read_all: 0");
    tap_is_int((long long)fs.n, 3, "read_all: only regular *.json files not starting with '.'");
    char *base = fs.n == 3 ? strrchr(fs.files[0].path, '/') : NULL;
    tap_ok(base && strcmp(base, "/a-3.json") == 0 && strstr(fs.files[1].path, "/b-2.json") &&
               strstr(fs.files[2].path, "/m-1.json"),
           "read_all: sorted by name");
    tap_ok(fs.n == 3 && strcmp(fs.files[0].data, "[]\n") == 0 && fs.files[0].size == 3, "read_all: contents");
    tc_files_free(&fs);
    snprintf(path, sizeof path, "%s/big.json", dir);
    FILE *f = fopen(path, "w");
    if (f) {
        for (long i = 0; i <= TC_MAX_FILE_SIZE; i++)
            fputc(' ', f);
        fclose(f);
    }
    tc_read_all(dir, &fs, &err);
    tap_is_int((long long)fs.n, 3, "read_all: a file over 1 MiB is skipped");
    tc_files_free(&fs);
    snprintf(path, sizeof path, "%s/does/not/exist", tmpdir);
    tap_ok(tc_read_all(path, &fs, &err) == 0 && fs.n == 0, "read_all: a missing directory is an empty cache");
    snprintf(path, sizeof path, "%s/b-2.json", dir);
    tap_ok(tc_read_all(path, &fs, &err) == -1 && err && strstr(err, "autotune cache"), "read_all: a file as the directory: error");
    free(err);

    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    tap_is_int(system(cmd), 0, "cleanup");
    return tap_done();
}
