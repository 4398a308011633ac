// Package httpgate puts redsem's fleet-wide limits at a service's HTTP
// edges: Limiter.Handler caps the requests coming in, per key (a tenant, a
// route, a client address), at most Slots in flight and N starts per
// interval across every replica, and answers 429 (or 503) with a
// Retry-After when a key is full; Limiter.Transport holds the requests
// going out to a partner API to the same kind of limit, and keeps a slot
// until the response body is closed.
//
// Each key has its own semaphore and rate gate, named "<Name>:<key>",
// made on first use; both expire from Redis once idle
// (Config.IdleExpiry), and a Limiter keeps at most Config.MaxKeys keys in
// memory, so a client sending random keys grows neither. While Redis
// fails, requests are refused (503) unless Config.FailOpen lets them
// through unlimited. Limiter.Hold is the same for any other edge (the
// grpcgate module's interceptors use it). docs/middleware.md tells the
// rest.
package httpgate
