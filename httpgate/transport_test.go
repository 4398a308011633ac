package httpgate

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redsem/redsem"
	"github.com/redsem/redsem/internal/redistest"
	"github.com/redsem/redsem/rate"
)

// partner is the API the outgoing requests go to: ?slow=1 sends its
// headers and a first line, then the rest once finish is closed.
func partner(t *testing.T, finish <-chan struct{}) *httptest.Server {
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "first\n")
		if r.URL.Query().Get("slow") != "" {
			w.(http.Flusher).Flush()
			select {
			case <-finish:
			case <-r.Context().Done():
			}
		}
		_, _ = io.WriteString(w, "rest\n")
	}))
	t.Cleanup(hs.Close)
	return hs
}

func client(t *testing.T, srv *redistest.Server, cfg Config) *http.Client {
	lim, err := New(srv.Pool(t), cfg)
	require.NoError(t, err)
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: lim.Transport(nil, tr)}
}

// TestTransportBodyClose: the slot of an outgoing request is held while
// its body is read, slowly, after the headers arrived, and comes back when
// the body is closed.
func TestTransportBodyClose(t *testing.T) {
	srv := redistest.Start(t)
	finish := make(chan struct{})
	api := partner(t, finish)
	c := client(t, srv, Config{Name: "out", Limit: Limit{Slots: 1}})
	ctx := ctxT(t, 30*time.Second)

	req, err := http.NewRequestWithContext(ctx, http.MethodGet, api.URL+"?slow=1", nil)
	require.NoError(t, err)
	resp, err := c.Do(req)
	require.NoError(t, err)
	line := make([]byte, 6)
	_, err = io.ReadFull(resp.Body, line)
	require.NoError(t, err)
	require.Equal(t, "first\n", string(line))

	_, _, _, err = get(ctx, c, api.URL)
	var full *FullError
	require.ErrorAs(t, err, &full, "the slow reader still holds the only slot")
	assert.ErrorIs(t, err, redsem.ErrNoToken)

	close(finish)
	_, err = io.ReadAll(resp.Body)
	require.NoError(t, err)
	_, _, _, err = get(ctx, c, api.URL)
	require.ErrorAs(t, err, &full, "a body read to its end but not closed keeps the slot")
	require.NoError(t, resp.Body.Close())
	require.NoError(t, resp.Body.Close(), "a second Close is harmless")

	code, _, body, err := get(ctx, c, api.URL)
	require.NoError(t, err, "Close gave the slot back")
	assert.Equal(t, http.StatusOK, code)
	assert.Equal(t, "first\nrest\n", body)
	requireFree(t, srv.Pool(t), "out:", 1)
}

// TestTransportFailureReleases: a request that fails (nobody listens)
// gives its slot back.
func TestTransportFailureReleases(t *testing.T) {
	srv := redistest.Start(t)
	api := partner(t, nil)
	url := api.URL
	api.Close()
	c := client(t, srv, Config{Name: "out", Limit: Limit{Slots: 1}})
	_, _, _, err := get(ctxT(t, 30*time.Second), c, url)
	require.Error(t, err)
	var full *FullError
	require.False(t, errors.As(err, &full), "not refused by the limiter: %v", err)
	requireFree(t, srv.Pool(t), "out:", 1)
}

// TestTransportRate: outgoing requests over the gate's rate wait for a
// start (Wait negative); without Wait they fail with the gate's RetryAfter.
func TestTransportRate(t *testing.T) {
	srv := redistest.Start(t)
	api := partner(t, nil)
	ctx := ctxT(t, 30*time.Second)

	waits := client(t, srv, Config{Name: "waits", Limit: Limit{N: 2, Per: 100 * time.Millisecond}, Wait: -1})
	for i := 0; i < 5; i++ {
		code, _, _, err := get(ctx, waits, api.URL)
		require.NoError(t, err, "request %d", i)
		assert.Equal(t, http.StatusOK, code)
	}
	gate, err := rate.New(srv.Pool(t), "waits:", 2, 100*time.Millisecond)
	require.NoError(t, err)
	st, err := gate.Status(ctx)
	require.NoError(t, err)
	assert.Zero(t, st.Waiting)

	sheds := client(t, srv, Config{Name: "sheds", Limit: Limit{N: 2, Per: time.Minute}})
	for i := 0; i < 2; i++ {
		_, _, _, err := get(ctx, sheds, api.URL)
		require.NoError(t, err, "request %d", i)
	}
	_, _, _, err = get(ctx, sheds, api.URL)
	var full *FullError
	require.ErrorAs(t, err, &full)
	assert.ErrorIs(t, err, rate.ErrRateLimited)
	assert.Greater(t, full.RetryAfter, time.Second)
}

// TestTransportCancelWhileWaiting: an outgoing request whose context ends
// while it waits for a slot fails with the context's error and takes
// nothing.
func TestTransportCancelWhileWaiting(t *testing.T) {
	srv := redistest.Start(t)
	finish := make(chan struct{})
	api := partner(t, finish)
	c := client(t, srv, Config{Name: "out", Limit: Limit{Slots: 1, N: 100, Per: time.Second}, Wait: -1})
	ctx := ctxT(t, 30*time.Second)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, api.URL+"?slow=1", nil)
	require.NoError(t, err)
	resp, err := c.Do(req)
	require.NoError(t, err)

	cctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	_, _, _, err = get(cctx, c, api.URL)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	var full *FullError
	require.False(t, errors.As(err, &full), "the caller's own deadline is not a full key: %v", err)

	close(finish)
	require.NoError(t, resp.Body.Close())
	requireFree(t, srv.Pool(t), "out:", 1)
}
