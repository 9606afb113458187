/* tools/dupfind.c: the duplicate finder behind `make dupcheck`.
 *
 * Reads source and build files (C/CUDA, Lua, shell, Makefiles) and lists the
 * pairs of files that share a run of MIN (default 6) or more code lines, so
 * that drift between copies shows up in review. A template NAME.X.tmpl is
 * read as language X (Makefile.tmpl as a Makefile): a tool that goes by the
 * extension alone would skip every template, where most copies live.
 *
 * What counts: blank lines, comments and template comments ({# #}, a line
 * `{% -- ... %}`) are passed over; white space is folded. "Thin" lines (no
 * word at all, such as a lone `}`, or only words like end/else/return, an
 * #include or a Lua require) must match but do not count toward a run's
 * length. Lines match in "shape" when they differ only in identifiers,
 * numbers and string literals; a run with any such line is flagged `shape`.
 * A run standing in more than MAXPLACES places is common idiom and left out.
 *
 * Usage: dupfind [--min N] [--max N] FILE... ("-": names one a line on
 * stdin; files of other kinds and missing files are skipped). Output: one
 * row per pair of files, longest first,
 *   a.c:10-24 ~ b.c:40-54 (15 lines[, shape][, +K more runs])
 * then a total. Exit 0 (a report), 1 with --max N when there are more than
 * N pairs, 2 on a usage or read error. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { MAXPLACES = 8, MAXFILE = 1 << 20 };
enum lang { L_NONE, L_C, L_LUA, L_HASH };

typedef struct {
  uint64_t shape, exact; /* hashes of the line's shape and folded text */
  int lineno, thin;
} line_t;
typedef struct {
  char *name;
  line_t *v;
  int n;
} file_t;
typedef struct {
  uint64_t h;
  int f, i;
} seed_t;
typedef struct {
  int fa, a0, a1, fb, b0, b1; /* line indices, inclusive */
  int lines, shape, more;
} run_t;

static file_t *files;
static int nfiles, capfiles;

static void *xrealloc(void *p, size_t n) {
  p = realloc(p, n ? n : 1);
  if (!p) { fputs("dupfind: out of memory\n", stderr); exit(2); }
  return p;
}

static int ends_with(const char *s, const char *suf) {
  size_t a = strlen(s), b = strlen(suf);
  return a >= b && strcmp(s + a - b, suf) == 0;
}

/* The language of a file by its name; *tmpl set for a template. */
static enum lang lang_of(const char *path, int *tmpl) {
  const char *base = strrchr(path, '/');
  char name[256];
  size_t n;
  base = base ? base + 1 : path;
  n = strlen(base);
  if (n >= sizeof name) return L_NONE;
  memcpy(name, base, n + 1);
  *tmpl = ends_with(name, ".tmpl");
  if (*tmpl) name[n - 5] = '\0';
  if (!strcmp(name, "Makefile") || !strcmp(name, "GNUmakefile")) return L_HASH;
  static const char *const c_ext[] = {".c", ".h", ".cu", ".cuh", ".cc", ".cpp", ".hpp"};
  static const char *const hash_ext[] = {".sh", ".test", ".am", ".ac", ".mk", ".py", ".gp"};
  for (size_t i = 0; i < sizeof c_ext / sizeof *c_ext; i++)
    if (ends_with(name, c_ext[i])) return L_C;
  for (size_t i = 0; i < sizeof hash_ext / sizeof *hash_ext; i++)
    if (ends_with(name, hash_ext[i])) return L_HASH;
  return ends_with(name, ".lua") ? L_LUA : L_NONE;
}

static uint64_t fnv(uint64_t h, const char *s, size_t n) {
  for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
  return h;
}
#define FNV0 14695981039346656037ull

static int is_word0(int c) { return c == '_' || (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z'); }
static int is_word(int c) { return is_word0(c) || (c >= '0' && c <= '9'); }
static int is_space(int c) { return c == ' ' || c == '\t' || c == '\r' || c == '\f' || c == '\v'; }

/* Copies a string literal starting at s[i] (the quote) to out; returns the
 * index after it (or the end of the line). */
static size_t copy_string(const char *s, size_t i, size_t n, char *out, size_t *o) {
  char q = s[i];
  out[(*o)++] = s[i++];
  while (i < n && s[i] != q) {
    if (s[i] == '\\' && i + 1 < n) out[(*o)++] = s[i++];
    out[(*o)++] = s[i++];
  }
  if (i < n) out[(*o)++] = s[i++];
  return i;
}

/* The code of one line (comments removed) into out; *blk is the state of
 * a block comment across lines. */
static void strip_comments(enum lang lg, const char *s, size_t n, int *blk, char *out) {
  size_t i = 0, o = 0;
  while (i < n) {
    if (*blk) {
      const char *end = lg == L_C ? "*/" : "]]";
      if (i + 1 < n && s[i] == end[0] && s[i + 1] == end[1]) { *blk = 0; i += 2; }
      else i++;
      continue;
    }
    char c = s[i], d = i + 1 < n ? s[i + 1] : 0;
    if (c == '"' || c == '\'') { i = copy_string(s, i, n, out, &o); continue; }
    if (lg == L_C && c == '/' && d == '/') break;
    if (lg == L_C && c == '/' && d == '*') { *blk = 1; i += 2; continue; }
    if (lg == L_LUA && c == '-' && d == '-') {
      if (i + 3 < n && s[i + 2] == '[' && s[i + 3] == '[') { *blk = 1; i += 4; continue; }
      break;
    }
    if (lg == L_HASH && c == '#' && (i == 0 || is_space(s[i - 1]) || s[i - 1] == ';')) break;
    out[o++] = s[i++];
  }
  out[o] = '\0';
}

/* Words kept as they are in a shape (every other word is "an identifier";
 * the basic types stay so that lists of fields of other types do not
 * match), and the subset that alone makes a line thin. */
static const char *const keywords[] = {
    "if", "else", "for", "while", "do", "return", "break", "continue", "switch", "case",
    "default", "goto", "struct", "typedef", "static", "const", "inline", "extern", "sizeof",
    "local", "function", "end", "then", "elseif", "nil", "true", "false", "and", "or",
    "not", "in", "repeat", "until", "fi", "done", "esac", "include", "define", "endif",
    "pragma", "once", "require", "void", "char", "int", "long", "float", "double",
    "unsigned", "size_t", "bool", NULL};
static const char *const thin_words[] = {
    "else", "do", "end", "then", "return", "break", "continue", "fi", "done", "esac",
    "endif", "include", "pragma", "once", "extern", "local", "require", NULL};

static int in_list(const char *const *list, const char *w, size_t n) {
  for (; *list; list++)
    if (strlen(*list) == n && !strncmp(*list, w, n)) return 1;
  return 0;
}

/* Hashes of a line's code (folded text and shape) and whether it is thin.
 * Returns 0 for a line without code. */
static int classify(const char *code, line_t *ln) {
  uint64_t ex = FNV0, sh = FNV0;
  int fat = 0, space = 0, any = 0;
  for (size_t i = 0; code[i];) {
    char c = code[i];
    if (is_space(c)) { space = 1; i++; continue; }
    if (space && any) ex = fnv(ex, " ", 1);
    space = 0;
    any = 1;
    size_t j = i + 1;
    if (c == '{' && code[i + 1] == '{') { /* template substitution: an identifier */
      const char *e = strstr(code + i, "}}");
      j = e ? (size_t)(e - code) + 2 : strlen(code);
      sh = fnv(sh, "I", 1);
      fat = 1;
    } else if (c == '"' || c == '\'') {
      while (code[j] && code[j] != c) j += (code[j] == '\\' && code[j + 1]) ? 2 : 1;
      if (code[j]) j++;
      sh = fnv(sh, "S", 1);
      fat = 1;
    } else if (is_word(c)) {
      while (is_word(code[j]) || (!is_word0(c) && code[j] == '.')) j++;
      if (!is_word0(c)) sh = fnv(sh, "0", 1);
      else if (in_list(keywords, code + i, j - i)) sh = fnv(fnv(sh, code + i, j - i), " ", 1);
      else sh = fnv(sh, "I", 1);
      if (is_word0(c) && !in_list(thin_words, code + i, j - i)) fat = 1;
    } else {
      sh = fnv(sh, &c, 1);
    }
    ex = fnv(ex, code + i, j - i);
    i = j;
  }
  if (!any) return 0;
  /* #include and require lines name another file: thin whatever the name */
  const char *t = code + strspn(code, " \t");
  if (!strncmp(t, "#include", 8) || strstr(t, "require(") || strstr(t, "require \"")) fat = 0;
  ln->thin = !fat;
  ln->exact = ex;
  ln->shape = sh ^ (ln->thin ? 0x9e3779b97f4a7c15ull : 0);
  return 1;
}

/* Code of a template line: "{# #}" dropped, a line `{% ... %}` read as Lua
 * (or as a comment when it starts with --). Returns the language to read
 * the text as, L_NONE for a comment line. */
static enum lang template_line(enum lang lg, char *s, size_t *n) {
  char *p, *q;
  while ((p = strstr(s, "{#")) && (q = strstr(p, "#}"))) memmove(p, q + 2, strlen(q + 2) + 1);
  *n = strlen(s);
  p = s + strspn(s, " \t");
  q = s + *n;
  while (q > p && is_space(q[-1])) q--;
  if (q - p >= 4 && p[0] == '{' && p[1] == '%' && q[-2] == '%' && q[-1] == '}') {
    p += 2;
    p += strspn(p, " \t");
    if (p[0] == '-' && p[1] == '-') return L_NONE;
    *n = (size_t)(q - 2 - p);
    memmove(s, p, *n);
    s[*n] = '\0';
    return L_LUA;
  }
  return lg;
}

static void read_file(const char *path) {
  int tmpl;
  enum lang lg = lang_of(path, &tmpl);
  if (lg == L_NONE) return;
  FILE *fp = fopen(path, "rb");
  if (!fp) return; /* listed but gone (deleted in the work tree) */
  char *buf = xrealloc(NULL, MAXFILE + 1);
  size_t len = fread(buf, 1, MAXFILE + 1, fp);
  fclose(fp);
  if (len > MAXFILE || memchr(buf, 0, len)) {
    fprintf(stderr, "dupfind: %s: left out (larger than 1 MiB or binary)\n", path);
    free(buf);
    return;
  }
  buf[len] = '\0';
  if (nfiles == capfiles) files = xrealloc(files, (capfiles = capfiles * 2 + 16) * sizeof *files);
  file_t *f = &files[nfiles++];
  f->name = strdup(path);
  f->v = NULL;
  f->n = 0;
  char *line = xrealloc(NULL, len + 1), *code = xrealloc(NULL, len + 1);
  int blk = 0, cap = 0, lineno = 0;
  for (char *s = buf; *s;) {
    char *e = strchr(s, '\n');
    size_t n = e ? (size_t)(e - s) : strlen(s);
    memcpy(line, s, n);
    line[n] = '\0';
    lineno++;
    s += n + (e != NULL);
    enum lang ll = tmpl ? template_line(lg, line, &n) : lg;
    if (ll == L_NONE) continue;
    int lua_blk = 0; /* a template's {% %} line stands alone: no block state */
    strip_comments(ll, line, n, ll == lg ? &blk : &lua_blk, code);
    if (lg == L_HASH && !strncmp(code, "dnl", 3) && !is_word(code[3])) continue;
    line_t ln = {0, 0, lineno, 0};
    if (!classify(code, &ln)) continue;
    if (f->n == cap) f->v = xrealloc(f->v, (size_t)(cap = cap * 2 + 64) * sizeof *f->v);
    f->v[f->n++] = ln;
  }
  free(line);
  free(code);
  free(buf);
}

static int cmp_seed(const void *x, const void *y) {
  const seed_t *a = x, *b = y;
  if (a->h != b->h) return a->h < b->h ? -1 : 1;
  if (a->f != b->f) return a->f - b->f;
  return a->i - b->i;
}

static int cmp_run_files(const void *x, const void *y) {
  const run_t *a = x, *b = y;
  if (a->fa != b->fa) return a->fa - b->fa;
  if (a->fb != b->fb) return a->fb - b->fb;
  if (a->lines != b->lines) return b->lines - a->lines;
  return a->a0 != b->a0 ? a->a0 - b->a0 : a->b0 - b->b0;
}

static int cmp_run_rows(const void *x, const void *y) {
  const run_t *a = x, *b = y;
  if (a->lines != b->lines) return b->lines - a->lines;
  if (a->fa != b->fa) return a->fa - b->fa;
  return a->fb - b->fb;
}

static run_t *runs;
static int nruns, capruns;

/* The maximal run through the seed pair (fa,i) ~ (fb,j), recorded only from
 * the seed at its first counted line, so each run is found once. */
static void extend(int minl, int fa, int i, int fb, int j) {
  const line_t *A = files[fa].v, *B = files[fb].v;
  int p = i, q = j;
  while (p > 0 && q > 0 && A[p - 1].shape == B[q - 1].shape) p--, q--;
  while (p < i && A[p].thin) p++, q++;
  if (p != i) return;
  while (p < files[fa].n && q < files[fb].n && A[p].shape == B[q].shape && (fa != fb || p < j)) p++, q++;
  /* a table of like lines in one file matches itself shifted: not a copy */
  if (fa == fb && p == j) return;
  while (p > i && A[p - 1].thin) p--, q--;
  int count = 0, shape = 0;
  for (int k = 0; k < p - i; k++) {
    count += !A[i + k].thin;
    shape |= A[i + k].exact != B[j + k].exact;
  }
  if (count < minl) return;
  if (nruns == capruns) runs = xrealloc(runs, (size_t)(capruns = capruns * 2 + 64) * sizeof *runs);
  runs[nruns++] = (run_t){fa, i, p - 1, fb, j, q - 1, count, shape, 0};
}

static void find_runs(int minl) {
  seed_t *seeds = NULL;
  size_t ns = 0, cap = 0;
  for (int f = 0; f < nfiles; f++) {
    const line_t *v = files[f].v;
    for (int i = 0; i < files[f].n; i++) {
      if (v[i].thin) continue;
      uint64_t h = FNV0;
      int k = i, c = 0;
      for (; k < files[f].n && c < minl; k++) {
        c += !v[k].thin;
        h = fnv(h, (const char *)&v[k].shape, sizeof v[k].shape);
      }
      if (c < minl) break;
      if (ns == cap) seeds = xrealloc(seeds, (cap = cap * 2 + 1024) * sizeof *seeds);
      seeds[ns++] = (seed_t){h, f, i};
    }
  }
  if (ns) qsort(seeds, ns, sizeof *seeds, cmp_seed); /* seeds may be NULL: no qsort(NULL, 0) (UB) */
  for (size_t g = 0, e; g < ns; g = e) {
    for (e = g + 1; e < ns && seeds[e].h == seeds[g].h; e++) {}
    if (e - g > MAXPLACES) continue;
    for (size_t x = g; x < e; x++)
      for (size_t y = x + 1; y < e; y++) extend(minl, seeds[x].f, seeds[x].i, seeds[y].f, seeds[y].i);
  }
  free(seeds);
}

static const char *usage = "usage: dupfind [--min N] [--max N] FILE... (- reads names from stdin)\n";

int main(int argc, char **argv) {
  int minl = 6, maxpairs = -1;
  for (int a = 1; a < argc; a++) {
    if ((!strcmp(argv[a], "--min") || !strcmp(argv[a], "--max")) && a + 1 < argc) {
      char *end;
      long v = strtol(argv[a + 1], &end, 10);
      if (*end || v < (argv[a][3] == 'n' ? 2 : 0) || v > 100000) { fputs(usage, stderr); return 2; }
      *(argv[a][3] == 'n' ? &minl : &maxpairs) = (int)v;
      a++;
    } else if (!strcmp(argv[a], "-")) {
      char name[4096];
      while (fgets(name, sizeof name, stdin)) {
        name[strcspn(name, "\n")] = '\0';
        if (*name) read_file(name);
      }
    } else if (argv[a][0] == '-') {
      fputs(usage, stderr);
      return 2;
    } else {
      read_file(argv[a]);
    }
  }
  find_runs(minl);
  /* one row per pair of files: its longest run, the others counted */
  if (nruns) qsort(runs, (size_t)nruns, sizeof *runs, cmp_run_files); /* runs may be NULL */
  int npairs = 0;
  for (int r = 0; r < nruns; r++) {
    if (npairs && runs[npairs - 1].fa == runs[r].fa && runs[npairs - 1].fb == runs[r].fb) runs[npairs - 1].more++;
    else runs[npairs++] = runs[r];
  }
  if (npairs) qsort(runs, (size_t)npairs, sizeof *runs, cmp_run_rows);
  for (int r = 0; r < npairs; r++) {
    const run_t *u = &runs[r];
    const line_t *A = files[u->fa].v, *B = files[u->fb].v;
    printf("%s:%d-%d ~ %s:%d-%d (%d lines%s", files[u->fa].name, A[u->a0].lineno, A[u->a1].lineno,
           files[u->fb].name, B[u->b0].lineno, B[u->b1].lineno, u->lines, u->shape ? ", shape" : "");
    if (u->more) printf(", +%d more run%s", u->more, u->more > 1 ? "s" : "");
    puts(")");
  }
  printf("dupfind: %d pair%s of files sharing %d or more code lines, %d files read\n", npairs,
         npairs == 1 ? "" : "s", minl, nfiles);
  return maxpairs >= 0 && npairs > maxpairs ? 1 : 0;
}
