package sentinel

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/gomodule/redigo/redis"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestOptions(t *testing.T) {
	for _, bad := range [][]Option{
		{nil}, {WithPoolSize(-1, 0)}, {WithFailoverWait(time.Millisecond)}, {WithFailoverWait(time.Hour)},
		{WithWait(0, time.Millisecond)}, {WithWait(1, 2*time.Second)},
	} {
		_, err := New(context.Background(), []string{"127.0.0.1:1"}, "m", bad...)
		assert.Error(t, err)
	}
	_, err := New(context.Background(), nil, "m")
	assert.Error(t, err)
	_, err = New(context.Background(), []string{"127.0.0.1:1"}, "")
	assert.Error(t, err)
}

func TestDemotedReplies(t *testing.T) {
	for msg, want := range map[string]bool{
		"READONLY You can't write against a read only replica.":                                        true,
		"UNBLOCKED force unblock from blocking operation, instance state changed (master -> replica?)": true,
		"MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.":             true,
		"ERR unknown command":         false,
		"NOSCRIPT No matching script": false,
		"READONLYX":                   false,
	} {
		assert.Equal(t, want, demoted(msg), msg)
	}
}

// TestEvents drives the Pool's reaction to sentinel events without a
// sentinel: a failover announced holds the Pool (no master in use) until a
// promotion, a switch, or an abort.
func TestEvents(t *testing.T) {
	p := &Pool{name: "m", raw: nil, changed: make(chan struct{}), stop: make(chan struct{})}
	p.raw = map[redis.Conn]string{}
	defer p.Close()
	p.install("127.0.0.1:1")
	require.Equal(t, "127.0.0.1:1", p.Master())

	p.event(evTry, "master other 127.0.0.1 1")
	assert.Equal(t, "127.0.0.1:1", p.Master(), "an event about another name must be ignored")
	p.event(evTry, "master m 127.0.0.1 1")
	assert.Equal(t, "", p.Master(), "+try-failover must stop the use of the master")
	assert.True(t, p.held)
	p.event("-failover-abort-not-elected", "master m 127.0.0.1 1")
	assert.False(t, p.held, "an abort ends the hold")

	p.event(evTry, "master m 127.0.0.1 1")
	p.event(evPromoted, "slave 127.0.0.1:2 127.0.0.1 2 @ m 127.0.0.1 1")
	assert.Equal(t, "127.0.0.1:2", p.Master())
	assert.False(t, p.held, "a promotion ends the hold")

	p.event(evSwitch, "other 127.0.0.1 2 127.0.0.1 9")
	assert.Equal(t, "127.0.0.1:2", p.Master())
	p.event(evSwitch, "m 127.0.0.1 2 127.0.0.1 3")
	assert.Equal(t, "127.0.0.1:3", p.Master())
	p.event(evSwitch, "m 127.0.0.1 2 garbage")
	assert.Equal(t, "127.0.0.1:3", p.Master(), "a malformed event must be ignored")
	st := p.Stats()
	assert.EqualValues(t, 2, st.Switches)
	assert.EqualValues(t, 2, st.Holds)
}
