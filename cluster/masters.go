package cluster

import "github.com/gomodule/redigo/redis"

// MasterPools returns the Pool's own connection pool of each master in the
// current slot map. Their connections are plain, not routing: a command runs
// on that node whatever its key. They are for what must run on every node,
// such as SCAN (admin.ScanNames uses them). Do not close them; Close closes
// them. Fails with ErrClosed after Close.
func (p *Pool) MasterPools() ([]*redis.Pool, error) {
	var pools []*redis.Pool
	for _, addr := range p.Masters() {
		np, err := p.nodePool(addr)
		if err != nil {
			return nil, err
		}
		pools = append(pools, np)
	}
	return pools, nil
}
