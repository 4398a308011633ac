//go:build linux

package main

import (
	"bytes"
	"context"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redsem/redsem/internal/redistest"
)

// lockedBuffer is a bytes.Buffer a command writes and a test polls.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// On a terminal, run hands it to the command, as flock(1) does: the
// command reads what is typed; Ctrl-Z does not leave it stopped (holding its
// slot); and the terminal comes back to the shell, so the next run reads it
// too.
func TestRunPassesTheTerminal(t *testing.T) {
	t.Parallel()
	script := redistest.Tool(t, "script", "apt-get install util-linux")
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	line := bin + ` run tty-a -- sh -c 'read x; echo "got=$x"' && ` +
		bin + ` run --size 1 tty-b -- sh -c 'echo ready; read y; echo "again=$y"'; echo "rc=$?"`
	cmd := exec.CommandContext(ctx, script, "-q", "-e", "-c", line, "/dev/null")
	cmd.Env = append(cleanEnv(), "REDIS_URL="+e.url, "TERM=xterm")
	var out lockedBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	in, err := cmd.StdinPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()

	_, err = in.Write([]byte("hello\n"))
	require.NoError(t, err)
	waitFor(t, 20*time.Second, "the second command to start", func() bool { return strings.Contains(out.String(), "ready") })
	_, err = in.Write([]byte("\x1a")) // Ctrl-Z
	require.NoError(t, err)
	_, err = in.Write([]byte("world\n"))
	require.NoError(t, err)
	select {
	case err := <-done:
		require.NoError(t, err, out.String())
	case <-ctx.Done():
		t.Fatalf("a command did not get the terminal: %q", out.String())
	}
	s := strings.ReplaceAll(out.String(), "\r", "")
	assert.Contains(t, s, "got=hello\n", "the first command read the terminal")
	assert.Contains(t, s, "again=world\n", "the second read it after Ctrl-Z")
	assert.Contains(t, s, "rc=0\n")
	in.Close()
}
