/* tests/test_tune_cache.c: the autotune cache on disk (gen/tune_cache.c):
 * where the directory is (explicit, MG_TUNE_CACHE, XDG_CACHE_HOME, HOME),
 * the key (stable, every part counts, spec_name does not), entry file
 * names, JSON string escaping, atomic writes (content, mode, no temporary
 * left, replacing an entry, errors) and reading the entries back (only
 * *.json, sorted, a missing directory is empty), within bounds: a huge file
 * and files past the caps are left out with a warning naming the directory
 * and the count, and the entry named for the spec / holding the GPU's name
 * is found among many others. CPU only. */
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

/* Writes DIR/NAME: a JSON object for GPU, padded to about SIZE bytes. */
static void write_entry(const char *dir, const char *name, const char *gpu, long size)
{
    char path[600];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    if (!f)
        return;
    long n = fprintf(f, "{\"format\": \"mamba-gen-tune 1\", \"key_parts\": {\"gpu\": \"%s\"}, \"pad\": \"", gpu);
    for (; n < size - 3; n++)
        fputc('x', f);
    fputs("\"}\n", f);
    fclose(f);
}

/* 1 if FS holds a file whose path ends in /NAME. */
static int has_file(const tc_files *fs, const char *name)
{
    for (size_t i = 0; i < fs->n; i++) {
        const char *b = strrchr(fs->files[i].path, '/');
        if (b && strcmp(b + 1, name) == 0)
            return 1;
    }
    return 0;
}

/* 1 if a warning of FS contains both A and B. */
static int has_warning(const tc_files *fs, const char *a, const char *b)
{
    for (size_t i = 0; i < fs->nwarnings; i++)
        if (strstr(fs->warnings[i], a) && strstr(fs->warnings[i], b))
            return 1;
    return 0;
}

/* The bounds of a lookup: many files, a huge one, the valid entry found. */
static void bounds(void)
{
    char dir[400], name[64], *err = NULL;
    tc_files fs;
    snprintf(dir, sizeof dir, "%s/many", tmpdir);
    mkdir(dir, 0755);
    /* 1100 entries of another GPU (3 KiB each: over TC_MAX_FILES and TC_MAX_BYTES), sorted before and after the
     * wanted ones, a huge file, and two entries for the GPU: one named for the spec, one not */
    for (int i = 0; i < 1100; i++) {
        snprintf(name, sizeof name, "%s-%04d.json", i % 2 ? "aaa" : "zzz", i);
        write_entry(dir, name, "NVIDIA A100", 3000);
    }
    write_entry(dir, "huge.json", "NVIDIA H200", TC_MAX_FILE_SIZE + 10);
    write_entry(dir, "mspec-0123456789abcdef.json", "NVIDIA H200", 2000);
    write_entry(dir, "other-name.json", "NVIDIA H200", 2000);
    tc_select sel = {"mspec", "NVIDIA H200"};
    tap_is_int(tc_read(dir, &sel, &fs, &err), 0, "bounds: tc_read: 0");
    size_t bytes = 0;
    for (size_t i = 0; i < fs.n; i++)
        bytes += fs.files[i].size;
    tap_ok(fs.n <= TC_MAX_FILES && bytes <= (size_t)TC_MAX_BYTES, "bounds: at most TC_MAX_FILES, TC_MAX_BYTES handed over");
    tap_ok(has_file(&fs, "mspec-0123456789abcdef.json"), "bounds: the entry named for the spec is found among 1100 others");
    tap_ok(has_file(&fs, "other-name.json"), "bounds: an entry holding the GPU's name is found too");
    tap_ok(!has_file(&fs, "huge.json") && has_warning(&fs, "huge.json", "skipped"), "bounds: the huge file is skipped, with a warning");
    char expect[64];
    snprintf(expect, sizeof expect, "%zu of 1102 entry files not read", 1102 - fs.n);
    tap_ok(has_warning(&fs, dir, expect), "bounds: a warning names the directory and how many files were not read");
    tc_files_free(&fs);
    /* no preference: still bounded, still honest */
    tap_ok(tc_read_all(dir, &fs, &err) == 0 && fs.n <= TC_MAX_FILES && has_warning(&fs, dir, "not read"),
           "bounds: tc_read_all is bounded and warns");
    tc_files_free(&fs);
    /* over TC_MAX_READ_BYTES: the entry named for the spec is read first */
    snprintf(dir, sizeof dir, "%s/large", tmpdir);
    mkdir(dir, 0755);
    long n = TC_MAX_READ_BYTES / (TC_MAX_FILE_SIZE - 100) + 8;
    for (long i = 0; i < n; i++) {
        snprintf(name, sizeof name, "a%04ld.json", i);
        write_entry(dir, name, "NVIDIA H200", TC_MAX_FILE_SIZE - 100);
    }
    write_entry(dir, "mspec-fedcba9876543210.json", "NVIDIA H200", 2000);
    write_entry(dir, "mspec-not-hex.json", "NVIDIA A100", 2000);
    tap_is_int(tc_read(dir, &sel, &fs, &err), 0, "read bound: tc_read: 0");
    tap_ok(has_file(&fs, "mspec-fedcba9876543210.json"), "read bound: the entry named for the spec is found");
    tap_ok(has_warning(&fs, dir, "not read"), "read bound: with a warning");
    tc_files_free(&fs);
    char *pre = tc_file_prefix("a b/c");
    tap_ok(pre && strcmp(pre, "a_b_c-") == 0, "tc_file_prefix: the file name's SPECNAME part");
    free(pre);
}

int main(void)
{
    tap_plan(45);
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
    tap_is_int((long long)fs.n, 3, "read_all: a file over TC_MAX_FILE_SIZE is skipped");
    tap_ok(fs.nwarnings == 1 && strstr(fs.warnings[0], "big.json: skipped") &&
               strstr(fs.warnings[0], "over the limit"),
           "read_all: ... with a warning naming it");
    tc_files_free(&fs);
    unlink(path);
    tc_read_all(dir, &fs, &err);
    tap_is_int((long long)fs.nwarnings, 0, "read_all: no warning when nothing is left out");
    tc_files_free(&fs);
    snprintf(path, sizeof path, "%s/does/not/exist", tmpdir);
    tap_ok(tc_read_all(path, &fs, &err) == 0 && fs.n == 0, "read_all: a missing directory is an empty cache");
    /* an existing directory without entries: no names to sort (qsort(NULL, 0) was UB; make check-sanitize) */
    snprintf(path, sizeof path, "%s/empty", tmpdir);
    mkdir(path, 0755);
    tc_select sel0 = {"m", "NVIDIA H200"};
    tap_ok(tc_read(path, &sel0, &fs, &err) == 0 && fs.n == 0 && fs.nwarnings == 0,
           "read: an empty directory is an empty cache, no warning");
    tc_files_free(&fs);
    snprintf(path, sizeof path, "%s/empty/notes.txt", tmpdir);
    write_file(path, "not an entry\n");
    snprintf(path, sizeof path, "%s/empty", tmpdir);
    tap_ok(tc_read_all(path, &fs, &err) == 0 && fs.n == 0 && fs.nwarnings == 0,
           "read_all: a directory without *.json is an empty cache");
    tc_files_free(&fs);
    snprintf(path, sizeof path, "%s/b-2.json", dir);
    tap_ok(tc_read_all(path, &fs, &err) == -1 && err && strstr(err, "autotune cache"), "read_all: a file as the directory: error");
    free(err);

    bounds();

    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    tap_is_int(system(cmd), 0, "cleanup");
    return tap_done();
}
