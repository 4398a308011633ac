package httpgate_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/gomodule/redigo/redis"

	"github.com/redsem/redsem/httpgate"
)

// exampleRedis starts an in-process Redis for the examples; use your own.
func exampleRedis() (addr string, stop func()) {
	m, err := miniredis.Run()
	if err != nil {
		panic(err)
	}
	return m.Addr(), m.Close
}

// At most 2 requests per tenant in flight and 5 per second, across every
// replica of the service: the third request of a tenant in the same second
// here is refused with 429 and a Retry-After.
func ExampleLimiter_Handler() {
	addr, stop := exampleRedis()
	defer stop()
	pool := &redis.Pool{MaxIdle: 8, Dial: func() (redis.Conn, error) { return redis.Dial("tcp", addr) }}
	defer pool.Close()

	lim, err := httpgate.New(pool, httpgate.Config{
		Name:  "api",
		Limit: httpgate.Limit{Slots: 2, N: 2, Per: time.Second},
	})
	if err != nil {
		panic(err)
	}
	tenant := func(r *http.Request) string { return r.Header.Get("X-Tenant") }
	hello := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, "hello") })
	srv := httptest.NewServer(lim.Handler(tenant, hello))
	defer srv.Close()

	for i := 0; i < 3; i++ {
		req, _ := http.NewRequest(http.MethodGet, srv.URL, nil)
		req.Header.Set("X-Tenant", "acme")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			panic(err)
		}
		resp.Body.Close()
		if retry := resp.Header.Get("Retry-After"); retry != "" {
			fmt.Println(resp.StatusCode, "Retry-After:", retry)
		} else {
			fmt.Println(resp.StatusCode)
		}
	}
	// Output:
	// 200
	// 200
	// 429 Retry-After: 1
}

// Call a partner API at most 10 times a second and 2 at once, across the
// fleet: the transport waits for a start and a slot before each request,
// and holds the slot until the response body is closed.
func ExampleLimiter_Transport() {
	addr, stop := exampleRedis()
	defer stop()
	pool := &redis.Pool{MaxIdle: 8, Dial: func() (redis.Conn, error) { return redis.Dial("tcp", addr) }}
	defer pool.Close()
	partner := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "pong") }))
	defer partner.Close()

	lim, err := httpgate.New(pool, httpgate.Config{
		Name:  "partner-api",
		Limit: httpgate.Limit{Slots: 2, N: 10, Per: time.Second},
		Wait:  -1, // queue for as long as each request's context allows
	})
	if err != nil {
		panic(err)
	}
	client := &http.Client{Transport: lim.Transport(nil, nil)}
	resp, err := client.Get(partner.URL)
	if err != nil {
		panic(err)
	}
	defer resp.Body.Close() // gives the slot back
	body, _ := io.ReadAll(resp.Body)
	fmt.Println(string(body))
	// Output: pong
}
