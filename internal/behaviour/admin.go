package behaviour

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redsem/redsem"
)

// testAcquireN: weighted acquisitions take k tokens at once, wait until k
// are free, and give all k back.
func testAcquireN(t *testing.T, e *env) {
	c := ctx(t, 30*time.Second)
	s := e.sem(t, 5)
	l3, err := s.AcquireN(c, 3)
	require.NoError(t, err)
	assert.Len(t, l3.Tokens(), 3)
	_, err = s.TryAcquireN(c, 3)
	require.ErrorIs(t, err, redsem.ErrNoToken)
	l2, err := s.TryAcquireN(c, 2)
	require.NoError(t, err)
	_, err = s.AcquireN(c, 6)
	require.Error(t, err, "more tokens than the size")

	type grant struct {
		l   *redsem.Lease
		err error
	}
	got := make(chan grant, 1)
	go func() {
		l, err := s.AcquireN(c, 4)
		got <- grant{l, err}
	}()
	WaitFor(t, 10*time.Second, "weighted waiter registered", func() bool { return e.waiting(t) >= 1 })
	require.NoError(t, l3.Release(c))
	select {
	case g := <-got:
		t.Fatalf("4 tokens granted while only 3 were free (err %v)", g.err)
	case <-time.After(100 * time.Millisecond):
	}
	require.NoError(t, l2.Release(c))
	var g grant
	select {
	case g = <-got:
	case <-c.Done():
		t.Fatal("weighted waiter not served")
	}
	require.NoError(t, g.err)
	assert.Len(t, g.l.Tokens(), 4)
	e.requireWhole(t, 1, 4)
	require.NoError(t, g.l.Release(c))
	e.requireWhole(t, 5, 0)
}

// testResize: the size stored in Redis is the one in force; a shrink grants
// nothing while more than the new size hold.
func testResize(t *testing.T, e *env) {
	c := ctx(t, 30*time.Second)
	s3 := e.sem(t, 3)
	a, err := s3.Acquire(c)
	require.NoError(t, err)
	require.NoError(t, e.adm().Resize(c, 5))
	st, err := e.adm().Status(c)
	require.NoError(t, err)
	assert.Equal(t, 5, st.Size)
	assert.Equal(t, 4, st.Available)
	_, err = s3.TryAcquire(c)
	require.ErrorIs(t, err, redsem.ErrSizeMismatch)
	b, err := e.sem(t, 5).TryAcquire(c)
	require.NoError(t, err)
	adopt := e.sem(t, 1, redsem.WithAdoptSize())
	d, err := adopt.TryAcquire(c)
	require.NoError(t, err)

	require.NoError(t, e.adm().Resize(c, 1))
	_, err = adopt.TryAcquire(c)
	require.ErrorIs(t, err, redsem.ErrNoToken, "granted while 3 hold a semaphore of size 1")
	require.NoError(t, a.Release(c))
	require.NoError(t, b.Release(c))
	_, err = adopt.TryAcquire(c)
	require.ErrorIs(t, err, redsem.ErrNoToken, "granted while 1 holds a semaphore of size 1")
	require.NoError(t, d.Release(c))
	l, err := adopt.TryAcquire(c)
	require.NoError(t, err)
	require.NoError(t, l.Release(c))
	e.requireWhole(t, 1, 0)
	require.ErrorIs(t, e.adm().Resize(c, 0), redsem.ErrInvalidSize)
}

func testCheckStatus(t *testing.T, e *env) {
	c := ctx(t, 20*time.Second)
	s := e.sem(t, 2)
	inv, err := e.adm().Check(c)
	require.NoError(t, err)
	assert.False(t, inv.Exists)
	assert.True(t, inv.Healthy())
	st, err := e.adm().Status(c)
	require.NoError(t, err)
	assert.False(t, st.Exists)

	l, err := s.Acquire(c)
	require.NoError(t, err)
	inv, err = e.adm().Check(c)
	require.NoError(t, err)
	assert.True(t, inv.Exists)
	assert.Equal(t, 2, inv.Size)
	assert.Equal(t, []string{l.Token()}, inv.Leased)
	assert.Len(t, inv.Free, 1)
	assert.Empty(t, inv.Missing)
	assert.False(t, inv.ServerTime.IsZero())
	// A stray element on the token list is reported, not counted.
	e.do(t, "RPUSH", e.key("tokens"), "forged")
	inv, err = e.adm().Check(c)
	require.NoError(t, err)
	assert.Equal(t, []string{"forged"}, inv.Strangers)
	assert.False(t, inv.Healthy())
	st, err = e.adm().Status(c)
	require.NoError(t, err)
	assert.Equal(t, 1, st.Stray)
	rep, err := e.adm().Repair(c)
	require.NoError(t, err, "%+v", rep)
	require.NoError(t, l.Release(c))
	e.requireWhole(t, 2, 0)
}

// testDelete: Delete removes the semaphore; its holders lose their leases
// and the next Acquire starts afresh.
func testDelete(t *testing.T, e *env) {
	c := ctx(t, 20*time.Second)
	s := e.sem(t, 2)
	l, err := s.Acquire(c)
	require.NoError(t, err)
	require.NoError(t, e.adm().Delete(c))
	st, err := e.adm().Status(c)
	require.NoError(t, err)
	assert.False(t, st.Exists)
	require.ErrorIs(t, l.Release(c), redsem.ErrLeaseLost)
	l2, err := s.Acquire(c)
	require.NoError(t, err)
	st, err = e.adm().Status(c)
	require.NoError(t, err)
	assert.Equal(t, 1, st.Available)
	require.NoError(t, l2.Release(c))
	e.requireWhole(t, 2, 0)
}
