package redsem_test

import (
	"bufio"
	"bytes"
	"fmt"
	"go/format"
	"go/parser"
	"go/token"
	"go/version"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestDocs_compile compiles every ```go block of the project's Markdown files
// (README.md, docs/*.md, and every other *.md in the repository) with the Go
// toolchain that runs the test, and vets it.
//
// A block is one of three kinds, told apart by parsing it:
//
//   - a whole program (it starts with a package clause), built as it is and
//     required to be gofmt'ed;
//   - declarations (funcs, types, vars), placed in a file of package main
//     after the scaffold below, and required to be gofmt'ed;
//   - statements, which become the body of `func snippet() error` in that
//     file, so a snippet may `return err`.
//
// The scaffold imports the packages listed in docImports and declares the
// names a fragment may use without declaring them: ctx (a
// context.Context), pool (a *redis.Pool), sem (a *redsem.Semaphore), db (a
// *sql.DB) and work (func(context.Context) error, "your code"). Anything else
// a fragment uses it declares itself, and every variable it declares it uses:
// a fragment that would not compile in a user's program does not compile
// here. A block that needs a package the scaffold does not import (the
// goredis module, for one) is written as a whole program. Each block is its
// own package of one temporary module whose go.mod replaces this
// repository's modules (the root and every nested go.mod) with this
// checkout; compiler errors point at the Markdown line (//line directives).
// A block importing a nested module whose go line is newer than the running
// Go is skipped with a log line (the oldest-Go CI step cannot build it).
func TestDocs_compile(t *testing.T) {
	t.Parallel()
	root := repoRoot(t)
	files := markdownFiles(t, root)
	require.Contains(t, files, filepath.Join(root, "README.md"))
	var blocks []docBlock
	for _, f := range files {
		blocks = append(blocks, goBlocks(t, f)...)
	}
	require.NotEmpty(t, blocks, "no ```go block found")
	out, err := buildDocBlocks(t, root, blocks)
	require.NoError(t, err, "Go blocks in the Markdown do not build:\n%s", out)
}

// TestDocs_compileCatchesBrokenBlocks shows that the check fails, pointing at
// the Markdown line, for each kind of block that does not compile, and
// passes the same blocks once they are fixed.
func TestDocs_compileCatchesBrokenBlocks(t *testing.T) {
	t.Parallel()
	root := repoRoot(t)
	md := filepath.Join(t.TempDir(), "broken.md")
	text := "# broken\n\n" +
		"```go\nlease, err := sem.Acquire(ctx)\nif err != nil { ... }\n```\n\n" + // line 5: `{ ... }`
		"```go\nfunc handle() {\n\tgate.TryAcquire(ctx)\n}\n```\n\n" + // line 10: undefined gate
		"```go\npackage main\n\nfunc main() {\n\tx := 1\n}\n```\n\n" + // line 18: x declared and not used
		"```go\nlease, _ := sem.Acquire(ctx)\n```\n" // line 23: lease declared and not used
	require.NoError(t, os.WriteFile(md, []byte(text), 0o644))
	blocks := goBlocks(t, md)
	require.Len(t, blocks, 4)
	out, err := buildDocBlocks(t, root, blocks)
	require.Error(t, err, "broken blocks must fail the check")
	for _, line := range []int{5, 10, 18, 23} {
		require.Contains(t, out, fmt.Sprintf("broken.md:%d:", line), "an error must point at line %d:\n%s", line, out)
	}

	fixed := "# fixed\n\n" +
		"```go\nlease, err := sem.Acquire(ctx)\nif err != nil {\n\treturn err\n}\ndefer lease.Release(ctx)\n```\n\n" +
		"```go\nfunc handle() {\n\tif lease, err := sem.TryAcquire(ctx); err == nil {\n\t\tlease.Release(ctx)\n\t}\n}\n```\n\n" +
		"```go\npackage main\n\nfunc main() {\n\tx := 1\n\t_ = x\n}\n```\n"
	require.NoError(t, os.WriteFile(md, []byte(fixed), 0o644))
	out, err = buildDocBlocks(t, root, goBlocks(t, md))
	require.NoError(t, err, "fixed blocks must pass:\n%s", out)
}

// docImports are the packages the scaffold of a fragment imports.
var docImports = []string{
	"context", "database/sql", "errors", "expvar", "fmt", "log", "math", "net/http", "os", "strconv", "time",
	"github.com/gomodule/redigo/redis", "github.com/redsem/redsem", "github.com/redsem/redsem/cluster",
	"github.com/redsem/redsem/rate", "github.com/redsem/redsem/admin", "github.com/redsem/redsem/httpgate",
}

type docBlock struct {
	file string // absolute path of the Markdown file
	line int    // line of the block's first line of code
	code string
}

func repoRoot(t *testing.T) string {
	t.Helper()
	wd, err := os.Getwd()
	require.NoError(t, err)
	_, err = os.Stat(filepath.Join(wd, "go.mod"))
	require.NoError(t, err, "run from the module root")
	return wd
}

// markdownFiles lists the *.md files of the repository, testdata and hidden
// directories excepted.
func markdownFiles(t *testing.T, root string) []string {
	t.Helper()
	var files []string
	err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path != root && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(d.Name(), ".md") {
			files = append(files, path)
		}
		return nil
	})
	require.NoError(t, err)
	sort.Strings(files)
	return files
}

// goBlocks returns the ```go (or ```golang) fenced blocks of a Markdown file.
func goBlocks(t *testing.T, path string) []docBlock {
	t.Helper()
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	var blocks []docBlock
	var cur *docBlock
	var body []string
	fence := ""
	sc := bufio.NewScanner(bytes.NewReader(data))
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		trimmed := strings.TrimLeft(line, " ")
		if fence == "" {
			if strings.HasPrefix(trimmed, "```") || strings.HasPrefix(trimmed, "~~~") {
				fence = trimmed[:len(trimmed)-len(strings.TrimLeft(trimmed, trimmed[:1]))]
				info := strings.Fields(trimmed[len(fence):])
				if len(info) > 0 && (info[0] == "go" || info[0] == "golang") {
					cur = &docBlock{file: path, line: n + 1}
					body = nil
				}
			}
			continue
		}
		if strings.HasPrefix(trimmed, fence) && strings.TrimSpace(strings.TrimLeft(trimmed, fence[:1])) == "" {
			if cur != nil {
				cur.code = strings.Join(body, "\n") + "\n"
				blocks = append(blocks, *cur)
				cur = nil
			}
			fence = ""
			continue
		}
		if cur != nil {
			body = append(body, line)
		}
	}
	require.NoError(t, sc.Err())
	require.Empty(t, fence, "%s: a code block is not closed", path)
	return blocks
}

// docModule is a module of this repository (the root, or a nested go.mod).
type docModule struct {
	path, dir, goVersion string
}

func repoModules(t *testing.T, root string) []docModule {
	t.Helper()
	var mods []docModule
	err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path != root && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if d.IsDir() || d.Name() != "go.mod" {
			return nil
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		m := docModule{dir: filepath.Dir(path)}
		for _, l := range strings.Split(string(data), "\n") {
			f := strings.Fields(l)
			if len(f) == 2 && f[0] == "module" {
				m.path = strings.Trim(f[1], `"`)
			}
			if len(f) == 2 && f[0] == "go" {
				m.goVersion = f[1]
			}
		}
		mods = append(mods, m)
		return nil
	})
	require.NoError(t, err)
	return mods
}

// buildDocBlocks writes each block as a package of a temporary module, then
// builds and vets them. It returns the go command's output.
func buildDocBlocks(t *testing.T, root string, blocks []docBlock) (string, error) {
	t.Helper()
	mods := repoModules(t, root)
	rootGo := ""
	for _, m := range mods {
		if m.dir == root {
			rootGo = m.goVersion
		}
	}
	require.NotEmpty(t, rootGo, "go line of %s/go.mod", root)

	dir := t.TempDir()
	var sums bytes.Buffer
	gomod := fmt.Sprintf("module redsem.example/docs\n\ngo %s\n\n", rootGo)
	// The versions the repository's modules pin (goredis's go-redis, say)
	// are required here too, so that a block importing them builds with
	// those versions, not the newest (which may need a newer Go).
	ours := map[string]bool{}
	for _, m := range mods {
		ours[m.path] = true
	}
	pinned := map[string]bool{}
	for _, m := range mods {
		gomod += fmt.Sprintf("replace %s => %s\n", m.path, m.dir)
		if s, err := os.ReadFile(filepath.Join(m.dir, "go.sum")); err == nil {
			sums.Write(s)
		}
		if m.goVersion != "" && version.Compare("go"+m.goVersion, runtime.Version()) > 0 {
			continue // its blocks are skipped, and its pins may need that Go too
		}
		text, err := os.ReadFile(filepath.Join(m.dir, "go.mod"))
		require.NoError(t, err)
		for _, req := range goModRequires(string(text)) {
			if f := strings.Fields(req); !ours[f[0]] && !pinned[f[0]] {
				pinned[f[0]] = true
				gomod += "require " + f[0] + " " + f[1] + "\n"
			}
		}
	}
	require.NoError(t, os.WriteFile(filepath.Join(dir, "go.mod"), []byte(gomod), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "go.sum"), sums.Bytes(), 0o644))

	var problems []string
	built := 0
	for i, b := range blocks {
		src, err := docSource(b)
		if err != nil {
			problems = append(problems, err.Error())
			continue
		}
		if m, skip := needsNewerGo(src, mods); skip {
			t.Logf("%s:%d: skipped: imports %s, which needs go %s (running %s)", b.file, b.line, m.path, m.goVersion, runtime.Version())
			continue
		}
		pkg := filepath.Join(dir, fmt.Sprintf("b%03d", i))
		require.NoError(t, os.MkdirAll(pkg, 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(pkg, "main.go"), src, 0o644))
		built++
	}
	if len(problems) > 0 {
		return strings.Join(problems, "\n"), fmt.Errorf("%d blocks are not gofmt'ed", len(problems))
	}
	if built == 0 {
		return "", nil
	}
	goCmd := filepath.Join(runtime.GOROOT(), "bin", "go")
	run := func(args ...string) (string, error) {
		cmd := exec.Command(goCmd, args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GOWORK=off", "GOTOOLCHAIN=local", "GOFLAGS=-mod=mod")
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	if out, err := run("mod", "tidy"); err != nil {
		return out, err
	}
	// Compiled by the compiler `go build` runs, but not linked: `go list
	// -export` stops at the export data, and a link of each block's program
	// is most of a build's time and checks nothing a reader wrote.
	if out, err := run("list", "-export", "./..."); err != nil {
		return out, err
	}
	// Fragments end with a `return nil` the scaffold adds: not unreachable code
	// a reader sees.
	return run("vet", "-unreachable=false", "./...")
}

// docSource is the Go file that builds block b, with //line directives that
// map it back to the Markdown.
func docSource(b docBlock) ([]byte, error) {
	lineDir := fmt.Sprintf("//line %s:%d\n", b.file, b.line)
	fset := token.NewFileSet()
	if _, err := parser.ParseFile(fset, "", b.code, parser.PackageClauseOnly); err == nil {
		if err := gofmtted(b, b.code); err != nil {
			return nil, err
		}
		return []byte(lineDir + b.code), nil
	}

	var src strings.Builder
	src.WriteString("package main\n\nimport (\n")
	for _, imp := range docImports {
		src.WriteString("\t" + strconv.Quote(imp) + "\n")
	}
	src.WriteString(`)

var (
	ctx  = context.Background()
	pool *redis.Pool
	sem  *redsem.Semaphore
	db   *sql.DB
	work = func(ctx context.Context) error { return ctx.Err() }
)

var (
	_ = errors.Is
	_ = expvar.Publish
	_ = fmt.Sprint
	_ = log.Print
	_ = math.Ceil
	_ = http.StatusOK
	_ = os.Getenv
	_ = strconv.Itoa
	_ = time.Second
	_ = cluster.New
	_ = rate.New
	_ = admin.New
	_ = httpgate.New
)

`)
	if _, err := parser.ParseFile(fset, "", "package main\n"+b.code, 0); err == nil {
		if err := gofmtted(b, "package main\n\n"+b.code); err != nil {
			return nil, err
		}
		if !strings.Contains(b.code, "func main()") {
			src.WriteString("func main() {}\n\n")
		}
		src.WriteString(lineDir + b.code)
		return []byte(src.String()), nil
	}
	src.WriteString("func main() {}\n\nfunc snippet() error {\n" + lineDir + b.code + "\treturn nil\n}\n")
	return []byte(src.String()), nil
}

func gofmtted(b docBlock, code string) error {
	want, err := format.Source([]byte(code))
	if err != nil || string(want) == code {
		return nil // a syntax error is for the compiler to report
	}
	return fmt.Errorf("%s:%d: block is not gofmt'ed; gofmt gives:\n%s", b.file, b.line, want)
}

// needsNewerGo reports a repository module that src imports and whose go
// line is newer than the running toolchain (the oldest-Go CI step cannot
// build it).
func needsNewerGo(src []byte, mods []docModule) (docModule, bool) {
	f, err := parser.ParseFile(token.NewFileSet(), "", src, parser.ImportsOnly)
	if err != nil {
		return docModule{}, false
	}
	for _, imp := range f.Imports {
		p, _ := strconv.Unquote(imp.Path.Value)
		for _, m := range mods {
			if (p == m.path || strings.HasPrefix(p, m.path+"/")) && m.goVersion != "" &&
				version.Compare("go"+m.goVersion, runtime.Version()) > 0 {
				return m, true
			}
		}
	}
	return docModule{}, false
}

// goModRequires returns the "path version" pairs a go.mod requires.
func goModRequires(gomod string) []string {
	var out []string
	inBlock := false
	for _, line := range strings.Split(gomod, "\n") {
		line = strings.TrimSpace(strings.SplitN(line, "//", 2)[0])
		switch {
		case line == "require (":
			inBlock = true
		case inBlock && line == ")":
			inBlock = false
		case inBlock && len(strings.Fields(line)) == 2:
			out = append(out, line)
		case strings.HasPrefix(line, "require ") && len(strings.Fields(line)) == 3:
			out = append(out, strings.TrimPrefix(line, "require "))
		}
	}
	return out
}

// TestDocs_readmeStaysShort: the README is the front page, under 300 lines; the
// deep material (failure modes, keys, benchmark tables) lives in docs/.
func TestDocs_readmeStaysShort(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile(filepath.Join(repoRoot(t), "README.md"))
	require.NoError(t, err)
	lines := strings.Count(string(b), "\n")
	require.Less(t, lines, 300, "README.md has %d lines: move detail to docs/", lines)
}

// TestDocs_linksResolve: every relative link of the project's Markdown files
// ([text](path) or [text](path#anchor)) names a file or directory of the
// repository.
func TestDocs_linksResolve(t *testing.T) {
	t.Parallel()
	root := repoRoot(t)
	link := regexp.MustCompile(`\]\(([^)\s]+)\)`)
	n := 0
	for _, md := range markdownFiles(t, root) {
		b, err := os.ReadFile(md)
		require.NoError(t, err)
		for _, m := range link.FindAllStringSubmatch(string(b), -1) {
			target, _, _ := strings.Cut(m[1], "#")
			if target == "" || strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			n++
			_, err := os.Stat(filepath.Join(filepath.Dir(md), target))
			assert.NoError(t, err, "%s links %s, which does not exist", strings.TrimPrefix(md, root+"/"), m[1])
		}
	}
	assert.Greater(t, n, 20, "relative links found")
}
