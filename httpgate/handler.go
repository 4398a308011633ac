package httpgate

import (
	"errors"
	"net/http"
	"strconv"
	"time"
)

// Handler returns next behind the limiter: each request takes its key's
// slot and start (Acquire) before next runs and gives the slot back when
// next returns. key picks the request's key (a tenant header, a route, a
// client address); nil puts every request under one key.
//
// A full key is answered with Config.FullStatus and a Retry-After header:
// the gate's figure rounded up to whole seconds, or 1 for a slot. While
// Redis fails, 503 with a Retry-After of DownRetryAfter, unless
// Config.FailOpen. A request whose own context ended while it waited is
// answered 503 too, without Retry-After (its client is gone). The
// request's context, as next sees it, is cancelled if its lease is lost
// (context.Cause says why, e.g. redsem.ErrLeaseLost); auto-refresh keeps
// the lease of a long request.
func (l *Limiter) Handler(key func(*http.Request) string, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		k := ""
		if key != nil {
			k = key(r)
		}
		ctx, release, err := l.Hold(r.Context(), k)
		if err != nil {
			l.refuse(w, r, err)
			return
		}
		defer release()
		next.ServeHTTP(w, r.WithContext(ctx))
	})
}

// refuse answers a request r that Acquire refused with err.
func (l *Limiter) refuse(w http.ResponseWriter, r *http.Request, err error) {
	var full *FullError
	if !errors.As(err, &full) {
		if r.Context().Err() == nil { // Redis fails, not the client
			w.Header().Set("Retry-After", strconv.FormatInt(retrySeconds(DownRetryAfter), 10))
		}
		http.Error(w, "unavailable", http.StatusServiceUnavailable)
		return
	}
	w.Header().Set("Retry-After", strconv.FormatInt(retrySeconds(full.RetryAfter), 10))
	http.Error(w, "too many requests, retry later", l.cfg.FullStatus)
}

// retrySeconds is d in whole seconds, rounded up, at least 1.
func retrySeconds(d time.Duration) int64 {
	return max(1, int64((d+time.Second-1)/time.Second))
}
