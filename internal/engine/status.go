package engine

import "github.com/gomodule/redigo/redis"

// StatusReply is status.lua's reply, decoded: what a semaphore's Status is
// read from (a rate gate has rate_status.lua).
type StatusReply struct {
	NowUs   int64             // Redis TIME, µs
	Meta    map[string]string // the meta hash; empty when the name does not exist
	Tokens  []string          // the free list, in order
	Leases  []string          // token, score, token, score...
	Holders map[string]string // the holders hash
	Waiting int               // registered waiters
}

// ParseStatus decodes status.lua's reply.
func ParseStatus(vals []interface{}) (StatusReply, error) {
	var (
		r       StatusReply
		meta    []string
		holders []string
	)
	if _, err := redis.Scan(vals, &r.NowUs, &meta, &r.Tokens, &r.Leases, &holders, &r.Waiting); err != nil {
		return r, err
	}
	r.Meta, r.Holders = Pairs(meta), Pairs(holders)
	return r, nil
}
