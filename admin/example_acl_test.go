package admin_test

import (
	"fmt"
	"strings"

	"github.com/redsem/redsem/admin"
)

// The least-privilege Redis user for redsem under the default prefix: only
// the commands it sends, only its keys, no channels.
func ExampleACLCommands() {
	fmt.Println("ACL SETUSER redsem-app on >secret resetkeys ~redsem:* resetchannels -@all +" +
		strings.Join(admin.ACLCommands(), " +"))
	// Output:
	// ACL SETUSER redsem-app on >secret resetkeys ~redsem:* resetchannels -@all +blmove +blpop +del +eval +evalsha +exists +hdel +hget +hgetall +hincrby +hkeys +hmget +hset +hsetnx +lindex +llen +lpop +lpush +lrange +lrem +persist +pexpire +pexpireat +rpush +script|load +time +type +zadd +zincrby +zmscore +zrange +zrangebyscore +zrem +zscore
}
