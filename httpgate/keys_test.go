package httpgate

import (
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gomodule/redigo/redis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redsem/redsem/internal/redistest"
	"github.com/redsem/redsem/rate"
)

// TestKeysExpireAndStayBounded: keys sent by clients (here 50 tenants) do
// not pile up: the Limiter keeps at most MaxKeys of them in memory, and
// their semaphores and rate gates leave Redis once idle.
func TestKeysExpireAndStayBounded(t *testing.T) {
	srv := redistest.Start(t)
	var g gauge
	r := newReplica(t, srv, Config{Name: "api", Limit: Limit{Slots: 2, N: 5, Per: 200 * time.Millisecond},
		IdleExpiry: 100 * time.Millisecond, MaxKeys: 8}, tenant, g.handler(func(*http.Request) {}))
	ctx := ctxT(t, 30*time.Second)
	for i := 0; i < 50; i++ {
		code, _, _, err := get(ctx, http.DefaultClient, r.srv.URL, "X-Tenant", "t"+strconv.Itoa(i))
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, code)
	}
	r.lim.mu.Lock()
	inMemory, listed := len(r.lim.keys), r.lim.lru.Len()
	r.lim.mu.Unlock()
	assert.Equal(t, 8, inMemory, "MaxKeys bounds the keys kept in memory")
	assert.Equal(t, inMemory, listed)
	rateKeys, err := redis.Strings(srv.Do(t, "KEYS", "*:rate:*"), nil)
	require.NoError(t, err)
	require.NotEmpty(t, rateKeys, "the rate gates were made in Redis")
	eventually(t, func() bool { return dbInt(t, srv, "DBSIZE") == 0 }, "idle keys' semaphores and rate gates expire from Redis")
}

// TestKeyName: a key is part of the name; one too long for a name is
// replaced by its hash, so that it is limited like any other.
func TestKeyName(t *testing.T) {
	assert.Equal(t, "api:tenant-1", keyName("api", "tenant-1"))
	long := strings.Repeat("x", 600)
	n := keyName("api", long)
	assert.True(t, strings.HasPrefix(n, "api:sha256:"), n)
	assert.LessOrEqual(t, len(n), 512)
	assert.NotEqual(t, n, keyName("api", long+"y"))

	srv := redistest.Start(t)
	var g gauge
	r := newReplica(t, srv, Config{Name: "api", Limit: Limit{N: 1, Per: time.Minute}}, tenant, g.handler(func(*http.Request) {}))
	ctx := ctxT(t, 30*time.Second)
	for _, want := range []int{http.StatusOK, http.StatusTooManyRequests} {
		code, _, _, err := get(ctx, http.DefaultClient, r.srv.URL, "X-Tenant", long)
		require.NoError(t, err)
		assert.Equal(t, want, code, "a long key is limited too")
	}
}

// TestNewChecks: New refuses a Config it cannot serve, before any I/O.
func TestNewChecks(t *testing.T) {
	pool := &redis.Pool{}
	for name, cfg := range map[string]Config{
		"no name":    {Limit: Limit{Slots: 1}},
		"no limit":   {Name: "a"},
		"bad status": {Name: "a", Limit: Limit{Slots: 1}, FullStatus: 500},
		"bad rate":   {Name: "a", Limit: Limit{N: 1}},
		"bad slots":  {Name: "a", Limit: Limit{Slots: -1}},
		"short idle": {Name: "a", Limit: Limit{Slots: 1}, IdleExpiry: time.Millisecond},
	} {
		_, err := New(pool, cfg)
		assert.Error(t, err, name)
	}
}

// TestRateOptionsTurnTheExpiryOff: RateOptions come after the Limiter's own,
// so rate.WithIdleExpiry(0) there keeps a key's gate (and a rate set on it
// at run time) for good; its semaphore still expires.
func TestRateOptionsTurnTheExpiryOff(t *testing.T) {
	srv := redistest.Start(t)
	var g gauge
	r := newReplica(t, srv, Config{Name: "api", Limit: Limit{Slots: 1, N: 5, Per: time.Second},
		IdleExpiry: 100 * time.Millisecond, RateOptions: []rate.Option{rate.WithIdleExpiry(0)}},
		tenant, g.handler(func(*http.Request) {}))
	code, _, _, err := get(ctxT(t, 30*time.Second), http.DefaultClient, r.srv.URL, "X-Tenant", "t1")
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, code)
	rateKeys, err := redis.Strings(srv.Do(t, "KEYS", "*:rate:*"), nil)
	require.NoError(t, err)
	require.NotEmpty(t, rateKeys)
	for _, k := range rateKeys {
		assert.Equal(t, -1, dbInt(t, srv, "PTTL", k), "%s has a TTL", k)
	}
	eventually(t, func() bool { return dbInt(t, srv, "DBSIZE") == len(rateKeys) }, "the semaphore's keys expire")
}
