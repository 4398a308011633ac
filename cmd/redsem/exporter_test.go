//go:build unix

package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redsem/redsem"
	"github.com/redsem/redsem/internal/redistest"
	"github.com/redsem/redsem/rate"
)

// exporterProc is a running "redsem exporter": its /metrics URL and what it
// has logged so far.
type exporterProc struct {
	url  string
	cmd  *exec.Cmd
	mu   sync.Mutex
	log  []string
	done chan struct{}
}

func (p *exporterProc) lines() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.log...)
}

// startExporter runs the redsem binary's exporter with args and REDIS_URL
// url, and waits for the line that says where it serves.
func startExporter(t *testing.T, url string, args ...string) *exporterProc {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"exporter", "--listen", "127.0.0.1:0"}, args...)...)
	cmd.Env = append(cleanEnv(), "REDIS_URL="+url)
	stderr, err := cmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	p := &exporterProc{cmd: cmd, done: make(chan struct{})}
	serving := make(chan string, 1)
	go func() {
		defer close(p.done)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			p.mu.Lock()
			p.log = append(p.log, sc.Text())
			p.mu.Unlock()
			if u := regexp.MustCompile(`http://\S+/metrics`).FindString(sc.Text()); u != "" {
				select {
				case serving <- u:
				default:
				}
			}
		}
		_ = cmd.Wait()
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-p.done
	})
	select {
	case p.url = <-serving:
	case <-p.done:
		t.Fatalf("redsem exporter exited: %q", p.lines())
	case <-time.After(20 * time.Second):
		t.Fatalf("redsem exporter did not say where it serves: %q", p.lines())
	}
	return p
}

func (p *exporterProc) scrape(t *testing.T) string {
	t.Helper()
	client := &http.Client{Timeout: 15 * time.Second}
	resp, err := client.Get(p.url)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return string(body)
}

// stop sends SIGTERM and returns the exit code.
func (p *exporterProc) stop(t *testing.T) int {
	t.Helper()
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		t.Fatal("redsem exporter did not stop on SIGTERM")
	}
	return p.cmd.ProcessState.ExitCode()
}

// redsem exporter is part of the redsem binary: it serves every kind of
// the fleet for its prefix, reads the database the URL names, and exits 0
// on SIGTERM. promtool (Debian's prometheus package) finds nothing to
// say about what it serves, where it is installed.
func TestExporterServes(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	pool := fleetPool(t, e)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	s, err := redsem.NewSemaphore(pool, "jobs", 3, redsem.WithPrefix("app:"), redsem.WithFixedTTL())
	require.NoError(t, err)
	_, err = s.TryAcquire(ctx)
	require.NoError(t, err)
	g, err := rate.New(pool, "api", 10, time.Minute, rate.WithPrefix("app:"))
	require.NoError(t, err)
	_, err = g.Allow(ctx)
	require.NoError(t, err)

	p := startExporter(t, e.url, "--prefix", "app:")
	body := p.scrape(t)
	assert.Contains(t, body, `redsem_holders{kind="semaphore",name="jobs"} 1`)
	assert.Contains(t, body, `redsem_size{kind="semaphore",name="jobs"} 3`)
	assert.Contains(t, body, `redsem_rate_window_starts{kind="rate",name="api"} 1`)
	assert.Contains(t, body, "redsem_scrape_error 0")
	assert.Contains(t, body, "redsem_scrape_names 2")
	assert.Contains(t, body, "go_goroutines")
	// The page exporter --help points to lists every metric served.
	doc := regexp.MustCompile(`metrics are listed in (docs/[a-z-]+\.md)`).FindStringSubmatch(exporterHelp)
	require.NotNil(t, doc, "exporter --help names the page of its metrics")
	page, err := os.ReadFile(filepath.Join("..", "..", doc[1]))
	require.NoError(t, err)
	for _, m := range regexp.MustCompile(`(?m)^# TYPE (redsem_\w+)`).FindAllStringSubmatch(body, -1) {
		assert.True(t, strings.Contains(string(page), "`"+m[1]+"`"), "%s, the page exporter --help names, does not list %s", doc[1], m[1])
	}

	if promtool, err := exec.LookPath("promtool"); err == nil {
		cmd := exec.Command(promtool, "check", "metrics")
		cmd.Stdin = strings.NewReader(body)
		out, err := cmd.CombinedOutput()
		assert.NoError(t, err, "promtool check metrics: %s", out)
		assert.Empty(t, strings.TrimSpace(string(out)), "promtool check metrics")
	} else if os.Getenv("REDSEM_REQUIRE_REDIS") != "" {
		t.Error("promtool not on PATH (Debian: apt-get install prometheus), and REDSEM_REQUIRE_REDIS asks for every check")
	} else {
		t.Log("promtool not on PATH (Debian: apt-get install prometheus): its check did not run; testutil.CollectAndLint in the exporter module runs the same linter")
	}
	assert.Equal(t, 0, p.stop(t))
	assert.Equal(t, []string(nil), filterLines(p.lines(), "failed"), "no scrape failed")
}

func filterLines(lines []string, word string) []string {
	var out []string
	for _, l := range lines {
		if strings.Contains(l, word) {
			out = append(out, l)
		}
	}
	return out
}

// The exporter takes every URL the other commands take: host:port,
// unix://, rediss:// with --cacert, redis+sentinel://.
func TestExporterURLs(t *testing.T) {
	t.Parallel()
	sock := filepath.Join(t.TempDir(), "r.sock")
	srv := redistest.Start(t, "--unixsocket", sock, "--unixsocketperm", "700")
	s, err := redsem.NewSemaphore(srv.Pool(t), "jobs", 2, redsem.WithFixedTTL())
	require.NoError(t, err)
	_, err = s.TryAcquire(context.Background())
	require.NoError(t, err)

	certs := redistest.NewTLS(t)
	cert, err := tls.LoadX509KeyPair(certs.CertFile, certs.KeyFile)
	require.NoError(t, err)
	m, err := miniredis.RunTLS(&tls.Config{Certificates: []tls.Certificate{cert}})
	require.NoError(t, err)
	t.Cleanup(m.Close)

	set := redistest.StartSentinels(t, redistest.SentinelOptions{Replicas: 0, Sentinels: 1})
	master := set.Master()
	ms, err := redsem.NewSemaphore(master.Pool(t), "jobs", 2, redsem.WithFixedTTL())
	require.NoError(t, err)
	_, err = ms.TryAcquire(context.Background())
	require.NoError(t, err)

	for _, c := range []struct {
		url  string
		args []string
		want string
	}{
		{srv.Addr, nil, `redsem_holders{kind="semaphore",name="jobs"} 1`},
		{"unix://" + sock, nil, `redsem_holders{kind="semaphore",name="jobs"} 1`},
		{"rediss://" + m.Addr(), []string{"--cacert", certs.CAFile}, "redsem_scrape_names 0"},
		{"redis+sentinel://" + set.Addrs()[0] + "/" + redistest.SentinelName, nil, `redsem_holders{kind="semaphore",name="jobs"} 1`},
	} {
		p := startExporter(t, c.url, c.args...)
		body := p.scrape(t)
		assert.Contains(t, body, "redsem_scrape_error 0", c.url)
		assert.Contains(t, body, c.want, c.url)
		assert.Equal(t, 0, p.stop(t), c.url)
	}
}

// A URL the exporter cannot use is refused before it listens, with the
// same one line as every other command; bad flags too.
func TestExporterRefusesBadArguments(t *testing.T) {
	t.Parallel()
	e := &env{dir: t.TempDir(), url: "redis://127.0.0.1:1"}
	for _, c := range []struct {
		args []string
		msg  string
	}{
		{[]string{"--redis", "ftp://h"}, "scheme must be redis, rediss or unix"},
		{[]string{"--redis", "redis://h/x"}, "is not a number"},
		{[]string{"--redis", "unix://"}, "needs a socket path"},
		{[]string{"--cacert", "/nonexistent", "--redis", "rediss://h"}, "--cacert"},
		{[]string{"--insecure"}, "need a rediss:// URL"},
		{[]string{"--bogus"}, "unknown flag --bogus"},
		{[]string{"extra"}, "no arguments expected"},
		{[]string{"--limit", "0"}, "--limit"},
		{[]string{"--timeout", "soon"}, "--timeout"},
		{[]string{"--prefix", "a{"}, "prefix"},
	} {
		r := e.run(t, append([]string{"exporter", "--listen", "127.0.0.1:0"}, c.args...)...)
		assert.Equal(t, exitUsage, r.code, "%v: %s", c.args, r.stderr)
		assert.Equal(t, 1, strings.Count(r.stderr, "\n"), "%v: one line: %q", c.args, r.stderr)
		assert.Contains(t, r.stderr, c.msg, "%v", c.args)
		assert.NotContains(t, r.stderr, "serving", "%v", c.args)
	}
	r := e.run(t, "exporter", "--help")
	assert.Equal(t, 0, r.code)
	assert.Contains(t, r.stdout, "Usage: redsem exporter")
	assert.Contains(t, r.stdout, "--cacert")

	// A port taken: exit 69.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	r = e.run(t, "exporter", "--listen", ln.Addr().String())
	assert.Equal(t, exitUnavailable, r.code, r.stderr)
	assert.Contains(t, r.stderr, "address already in use")
}

// A scrape that cannot read Redis reports redsem_scrape_error 1 and logs
// why, once per --log-every for the same reason.
func TestExporterLogsFailedScrapes(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	down := ln.Addr().String()
	require.NoError(t, ln.Close())

	p := startExporter(t, "redis://"+down, "--log-every", "1h")
	for i := 0; i < 3; i++ {
		assert.Contains(t, p.scrape(t), "redsem_scrape_error 1")
	}
	assert.Equal(t, 0, p.stop(t))
	failed := filterLines(p.lines(), "failed")
	require.Len(t, failed, 1, "%q", p.lines())
	assert.Contains(t, failed[0], "redsem: exporter: ")
	assert.Contains(t, failed[0], "cannot reach Redis at redis://"+down)
	assert.Contains(t, failed[0], "connection refused")
}
