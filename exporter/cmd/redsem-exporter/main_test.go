package main

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net/http"
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redsem/redsem"
	"github.com/redsem/redsem/internal/redistest"
)

// The command serves /metrics for the prefix it is given until its context
// ends, then exits 0.
func TestServesMetrics(t *testing.T) {
	srv := redistest.Start(t)
	s, err := redsem.NewSemaphore(srv.Pool(t), "jobs", 3, redsem.WithPrefix("app:"))
	require.NoError(t, err)
	_, err = s.TryAcquire(context.Background())
	require.NoError(t, err)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pr, pw := io.Pipe()
	code := make(chan int, 1)
	go func() {
		code <- run(ctx, []string{"--listen", "127.0.0.1:0", "--prefix", "app:", "--redis", "redis://" + srv.Addr}, io.Discard, pw)
		pw.Close()
	}()
	line, err := bufio.NewReader(pr).ReadString('\n')
	require.NoError(t, err)
	go func() { _, _ = io.Copy(io.Discard, pr) }()
	url := regexp.MustCompile(`http://\S+/metrics`).FindString(line)
	require.NotEmpty(t, url, line)

	client := &http.Client{Timeout: 10 * time.Second}
	resp, err := client.Get(url)
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	assert.Contains(t, string(body), `redsem_holders{kind="semaphore",name="jobs"} 1`)
	assert.Contains(t, string(body), `redsem_size{kind="semaphore",name="jobs"} 3`)
	assert.Contains(t, string(body), "redsem_scrape_error 0")

	cancel()
	select {
	case c := <-code:
		assert.Equal(t, 0, c)
	case <-time.After(10 * time.Second):
		t.Fatal("the exporter did not stop when its context ended")
	}
}

func TestBadArguments(t *testing.T) {
	ctx := context.Background()
	for _, args := range [][]string{{"--bogus"}, {"extra"}, {"--limit", "0"}, {"--max-scan", "0"}, {"--prefix", "a{"}, {"--timeout", "soon"}} {
		var stderr bytes.Buffer
		assert.Equal(t, exitUsage, run(ctx, args, io.Discard, &stderr), "%v", args)
		assert.Equal(t, 1, bytes.Count(stderr.Bytes(), []byte("\n")), "%v: one line: %q", args, stderr.String())
	}
	var stdout bytes.Buffer
	assert.Equal(t, 0, run(ctx, []string{"--help"}, &stdout, io.Discard))
	assert.Contains(t, stdout.String(), "Usage: redsem-exporter")
}
