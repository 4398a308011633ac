package httpgate

import (
	"io"
	"net/http"
	"sync"
)

// Transport returns a RoundTripper that takes each request's key's slot
// and start (Acquire, with the request's context) before handing it to
// base (http.DefaultTransport if nil). The slot is given back when the
// response's body is closed, or when base fails: never earlier, so a slow
// reader of the body keeps it. key picks the request's key (a host, a
// partner's name); nil puts every request under one key. A refused request
// fails with Acquire's error, a *FullError when the key is full. If the
// lease is lost meanwhile, the request's context is cancelled.
//
// For "at most n calls per interval", set Config.Wait negative (or to a
// bound) so that requests queue rather than fail.
func (l *Limiter) Transport(key func(*http.Request) string, base http.RoundTripper) http.RoundTripper {
	if base == nil {
		base = http.DefaultTransport
	}
	return roundTripper(func(r *http.Request) (*http.Response, error) {
		k := ""
		if key != nil {
			k = key(r)
		}
		ctx, release, err := l.Hold(r.Context(), k)
		if err != nil {
			return nil, err
		}
		resp, err := base.RoundTrip(r.WithContext(ctx))
		if err != nil {
			release()
			return nil, err
		}
		resp.Body = &heldBody{ReadCloser: resp.Body, end: release}
		return resp, nil
	})
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// heldBody is a response body whose Close releases the request's slot.
type heldBody struct {
	io.ReadCloser
	once sync.Once
	end  func()
}

func (b *heldBody) Close() error {
	err := b.ReadCloser.Close()
	b.once.Do(b.end)
	return err
}
