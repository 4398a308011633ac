package goredis_test

import (
	"context"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestRootSuite runs the root package's whole behaviour suite (every test
// that calls eachBackend) on a go-redis client through this module's Pool,
// against a real redis-server per test, as it runs on redigo.
//
// Those tests are the root package's own (they use its internals), and the
// root module must not depend on go-redis, so the test copies the root
// module's tree to a temporary directory, adds one file that registers a
// "goredis" backend (extraBackends in helpers_test.go), requires go-redis
// and this module (replaced by this checkout) in the copy's go.mod, and runs
// `go test` there on the goredis backend alone (REDSEM_BACKENDS).
func TestRootSuite(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the root package's suite")
	}
	here, err := os.Getwd()
	require.NoError(t, err)
	root := filepath.Dir(here)
	dst := t.TempDir()
	copyRootModule(t, root, dst)

	tests := eachBackendTests(t, dst)
	require.NotEmpty(t, tests, "no test calls eachBackend: the suite moved?")
	require.NoError(t, os.WriteFile(filepath.Join(dst, "zz_goredis_backend_test.go"), []byte(goredisBackend), 0o644))

	gomod, err := os.ReadFile(filepath.Join(dst, "go.mod"))
	require.NoError(t, err)
	gomod = append(gomod, []byte("\nrequire github.com/redsem/redsem/goredis v0.0.0-00010101000000-000000000000\n\n"+
		"replace github.com/redsem/redsem/goredis => "+strconv.Quote(here)+"\n")...)
	require.NoError(t, os.WriteFile(filepath.Join(dst, "go.mod"), gomod, 0o644))
	sums := concat(t, filepath.Join(root, "go.sum"), filepath.Join(here, "go.sum"))
	require.NoError(t, os.WriteFile(filepath.Join(dst, "go.sum"), sums, 0o644))

	// The inner run ends a minute before this test would, so that it is
	// reported rather than orphaned with its redis-servers.
	ctx, timeout := context.Background(), 9*time.Minute
	if dl, ok := t.Deadline(); ok {
		timeout = time.Until(dl) - time.Minute
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, dl.Add(-30*time.Second))
		defer cancel()
	}
	args := []string{"test", "-count=1", "-v", "-timeout", timeout.Round(time.Second).String(),
		"-run", "^(" + strings.Join(tests, "|") + ")$", "."}
	if raceEnabled {
		args = append([]string{args[0], "-race"}, args[1:]...)
	}
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = dst
	// The copy's go.mod gains go-redis's own requirements (-mod=mod); every
	// sum is in the two go.sum files copied above, or in the module cache.
	cmd.Env = append(os.Environ(), "REDSEM_BACKENDS=goredis",
		"GOFLAGS="+strings.TrimSpace(os.Getenv("GOFLAGS")+" -mod=mod -buildvcs=false"), "GOWORK=off")
	out, err := cmd.CombinedOutput()
	ran := goredisPassed.FindAllSubmatch(out, -1)
	t.Logf("go %s: %d tests, %d go-redis runs passed\n%s", strings.Join(args[:len(args)-3], " "), len(tests), len(ran), lastLines(string(out), 3))
	require.NoError(t, err, "the root suite on go-redis:\n%s", failures(string(out)))
	require.Contains(t, string(out), "ok  \tgithub.com/redsem/redsem")
	// Every listed test ran on go-redis, not just passed by running nothing.
	passed := map[string]bool{}
	for _, m := range ran {
		passed[string(m[1])] = true
	}
	for _, name := range tests {
		require.True(t, passed[name], "%s has no goredis run that passed", name)
	}
}

// goredisPassed matches a passed go-redis run of a test in go test -v's
// output: "--- PASS: TestX/goredis" (possibly under a subtest of TestX).
var goredisPassed = regexp.MustCompile(`(?m)^\s*--- PASS: (Test\w+)/(?:.*/)?goredis \(`)

// failures keeps the lines of go test -v's output that say what failed.
func failures(out string) string {
	var keep []string
	for _, l := range strings.Split(out, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "=== ") && !strings.Contains(l, "--- PASS") {
			keep = append(keep, l)
		}
	}
	return lastLines(strings.Join(keep, "\n"), 200)
}

// goredisBackend is the file the copy gains: the goredis backend.
const goredisBackend = `package redsem

import (
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/redsem/redsem/goredis"
	"github.com/redsem/redsem/internal/redistest"
)

func init() {
	extraBackends = append(extraBackends, extraBackend{name: "goredis", start: func(t *testing.T) *backend {
		s := redistest.Start(t)
		c := redis.NewClient(&redis.Options{
			Addr:                     s.Addr,
			MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
		})
		t.Cleanup(func() { c.Close() })
		p, err := goredis.New(c)
		if err != nil {
			t.Fatal(err)
		}
		return &backend{name: "goredis", srv: s, addr: s.Addr, pool: p}
	}})
}
`

// copyRootModule copies the root module's files to dst: everything but
// .git and the nested modules (directories with a go.mod of their own).
func copyRootModule(t *testing.T, root, dst string) {
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, path)
		if err != nil {
			return err
		}
		if d.IsDir() {
			if rel != "." {
				if d.Name() == ".git" {
					return filepath.SkipDir
				}
				if _, err := os.Stat(filepath.Join(path, "go.mod")); err == nil {
					return filepath.SkipDir
				}
			}
			return os.MkdirAll(filepath.Join(dst, rel), 0o755)
		}
		if !d.Type().IsRegular() {
			return nil
		}
		return copyFile(path, filepath.Join(dst, rel))
	})
	require.NoError(t, err)
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.Create(dst)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

var testFunc = regexp.MustCompile(`(?m)^func (Test\w+)\(t \*testing\.T\) \{`)

// eachBackendTests lists the root package's tests whose body calls
// eachBackend.
func eachBackendTests(t *testing.T, dir string) []string {
	files, err := filepath.Glob(filepath.Join(dir, "*_test.go"))
	require.NoError(t, err)
	var names []string
	for _, f := range files {
		src, err := os.ReadFile(f)
		require.NoError(t, err)
		locs := testFunc.FindAllSubmatchIndex(src, -1)
		for i, loc := range locs {
			end := len(src)
			if i+1 < len(locs) {
				end = locs[i+1][0]
			}
			// The body ends at the first closing brace in column 0.
			if close := strings.Index(string(src[loc[1]:end]), "\n}\n"); close >= 0 {
				end = loc[1] + close
			}
			if strings.Contains(string(src[loc[1]:end]), "eachBackend(t, ") {
				names = append(names, string(src[loc[2]:loc[3]]))
			}
		}
	}
	sort.Strings(names)
	return names
}

func concat(t *testing.T, paths ...string) []byte {
	var all []byte
	for _, p := range paths {
		b, err := os.ReadFile(p)
		require.NoError(t, err)
		all = append(all, b...)
		if len(b) > 0 && b[len(b)-1] != '\n' {
			all = append(all, '\n')
		}
	}
	return all
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
