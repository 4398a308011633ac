package sentinel

import (
	"net"
	"strings"
	"time"

	"github.com/gomodule/redigo/redis"
)

// The sentinel events the Pool follows. A sentinel publishes each on the
// channel of its name; see the Redis Sentinel documentation.
const (
	// evTry: "master <name> <ip> <port>", a sentinel starts a failover.
	evTry = "+try-failover"
	// evAbort: "master <name> <ip> <port>", it gave the failover up.
	evAbort = "-failover-abort-*"
	// evPromoted: "slave <ip:port> <ip> <port> @ <name> <mip> <mport>",
	// the chosen replica now answers as a master.
	evPromoted = "+promoted-slave"
	// evSwitch: "<name> <oldip> <oldport> <newip> <newport>", the
	// sentinels now name the new master.
	evSwitch = "+switch-master"
)

// watch keeps a subscription to the failover events of one sentinel until
// Close, reconnecting after errors.
func (p *Pool) watch(addr string) {
	defer p.bg.Done()
	for n := 0; ; n++ {
		select {
		case <-p.stop:
			return
		default:
		}
		if p.subscribe(addr) {
			n = 0
		}
		t := time.NewTimer(min(100*time.Millisecond<<min(n, 4), time.Second))
		select {
		case <-p.stop:
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// subscribe listens to one sentinel until its connection fails or the Pool
// closes. It pings every second and gives up after 3s of silence. It
// reports whether it got as far as subscribing.
func (p *Pool) subscribe(addr string) bool {
	opts := append(p.sentinelOpts(), redis.DialReadTimeout(0))
	c, err := redis.Dial("tcp", addr, opts...)
	if err != nil {
		return false
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		c.Close()
		return false
	}
	p.subs[c] = struct{}{}
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		delete(p.subs, c)
		p.mu.Unlock()
		c.Close()
	}()
	psc := redis.PubSubConn{Conn: c}
	if err := psc.PSubscribe(evTry, evAbort, evPromoted, evSwitch); err != nil {
		return false
	}
	lastPing := time.Now()
	for {
		if time.Since(lastPing) >= time.Second {
			if err := psc.Ping(""); err != nil {
				return true
			}
			lastPing = time.Now()
		}
		switch m := psc.ReceiveWithTimeout(3 * time.Second).(type) {
		case redis.Message:
			p.event(m.Channel, string(m.Data))
		case error:
			return true
		}
	}
}

// event acts on one sentinel event about any master; those about other
// names are ignored.
func (p *Pool) event(channel, data string) {
	f := strings.Fields(data)
	switch {
	case channel == evTry && len(f) >= 4 && f[0] == "master" && f[1] == p.name:
		p.hold()
	case strings.HasPrefix(channel, "-failover-abort-") && len(f) >= 4 && f[0] == "master" && f[1] == p.name:
		p.unhold()
	case channel == evPromoted && len(f) >= 8 && f[0] == "slave" && f[4] == "@" && f[5] == p.name:
		p.install(net.JoinHostPort(f[2], f[3]))
	case channel == evSwitch && len(f) >= 5 && f[0] == p.name:
		p.install(net.JoinHostPort(f[3], f[4]))
	}
}

// hasFlag reports whether the comma-separated flags of SENTINEL MASTER hold
// flag.
func hasFlag(flags, flag string) bool {
	for _, f := range strings.Split(flags, ",") {
		if f == flag {
			return true
		}
	}
	return false
}

func containsFold(s, sub string) bool {
	return strings.Contains(strings.ToLower(s), strings.ToLower(sub))
}
