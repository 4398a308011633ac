package cluster

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/gomodule/redigo/redis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestSlot(t *testing.T) {
	assert.Equal(t, uint16(0x31C3), crc16("123456789"))
	// Values from CLUSTER KEYSLOT on redis-server 7.0.
	assert.Equal(t, 12182, Slot("foo"))
	assert.Equal(t, 5061, Slot("bar"))
	assert.Equal(t, Slot("user1000"), Slot("{user1000}.following"))
	assert.Equal(t, Slot("{user1000}.followers"), Slot("{user1000}.following"))
	assert.Equal(t, Slot("bar"), Slot("foo{bar}{zap}"))
	assert.Equal(t, int(crc16("foo{}{bar}")%SlotCount), Slot("foo{}{bar}"))
	assert.Equal(t, Slot("{bar"), int(crc16("{bar")%SlotCount))
	assert.Equal(t, Slot("a}b{"), int(crc16("a}b{")%SlotCount))
	assert.Equal(t, Slot("x"), Slot("redsem:{x}:meta"))
	assert.Equal(t, Slot("redsem:{x}:pend:0123456789abcdef"), Slot("redsem:{x}:tokens"))
}

func TestCommandKey(t *testing.T) {
	for _, tc := range []struct {
		cmd  string
		args []interface{}
		key  string
		ok   bool
	}{
		{"EVALSHA", []interface{}{"sha", 6, "k1", "k2", "a"}, "k1", true},
		{"evalsha", []interface{}{"sha", "2", []byte("k1"), "k2"}, "k1", true},
		{"EVAL", []interface{}{"return 1", 0, "arg"}, "", false},
		{"BLMOVE", []interface{}{"src", "dst", "LEFT", "RIGHT", "1.000"}, "src", true},
		{"BLPOP", []interface{}{"k", 0}, "k", true},
		{"LPUSH", []interface{}{"k", "v"}, "k", true},
		{"BLMPOP", []interface{}{1, 2, "k1", "k2", "LEFT"}, "k1", true},
		{"LMPOP", []interface{}{1, "k1", "LEFT"}, "k1", true},
		{"XREAD", []interface{}{"COUNT", 1, "STREAMS", "s1", "0"}, "s1", true},
		{"TIME", nil, "", false},
		{"INFO", []interface{}{"replication"}, "", false},
		{"WAIT", []interface{}{1, 100}, "", false},
		{"PING", nil, "", false},
		{"GET", nil, "", false},
	} {
		key, ok := commandKey(tc.cmd, tc.args)
		assert.Equal(t, tc.ok, ok, tc.cmd)
		assert.Equal(t, tc.key, key, tc.cmd)
	}
}

func TestRedirect(t *testing.T) {
	kind, slot, addr := redirect(redis.Error("MOVED 3999 127.0.0.1:6381"))
	assert.Equal(t, "MOVED", kind)
	assert.Equal(t, 3999, slot)
	assert.Equal(t, "127.0.0.1:6381", addr)
	kind, slot, addr = redirect(redis.Error("ASK 1 h:2"))
	assert.Equal(t, []interface{}{"ASK", 1, "h:2"}, []interface{}{kind, slot, addr})
	kind, _, _ = redirect(redis.Error("TRYAGAIN Multiple keys request during rehashing of slot"))
	assert.Equal(t, "TRYAGAIN", kind)
	kind, _, _ = redirect(redis.Error("UNBLOCKED force unblock from blocking operation"))
	assert.Equal(t, "UNBLOCKED", kind)
	kind, _, _ = redirect(redis.Error("ERR MOVED is not a redirect here"))
	assert.Equal(t, "", kind)
	kind, _, _ = redirect(redis.Error("MOVED 99999 h:1"))
	assert.Equal(t, "", kind)
	kind, _, _ = redirect(errors.New("MOVED 1 h:1"))
	assert.Equal(t, "", kind, "only error replies redirect")

	var re redis.Error
	assert.False(t, errors.As(error(&RedirectError{Kind: "MOVED"}), &re), "RedirectError must not look like a Redis error reply")
	assert.ErrorIs(t, &NotReplicatedError{Want: 1}, ErrNotReplicated)
}

func TestOptions(t *testing.T) {
	ctx := context.Background()
	_, err := New(ctx, nil)
	require.Error(t, err)
	for _, o := range []Option{WithWait(0, time.Second), WithWait(1, 0), WithWait(1, 2*time.Second),
		WithMaxRedirects(0), WithPoolSize(-1, 0), WithNodePool(nil), nil} {
		_, err := New(ctx, []string{"127.0.0.1:1"}, o)
		assert.Error(t, err)
	}
	_, err = NewWaitPool(&redis.Pool{}, 0, time.Second)
	assert.Error(t, err)
	// No node answers: New fails and leaks nothing.
	_, err = New(ctx, []string{"127.0.0.1:1"}, WithDialOptions(redis.DialConnectTimeout(100*time.Millisecond)))
	assert.ErrorIs(t, err, ErrNoNode)
}
