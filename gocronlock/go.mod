module github.com/redsem/redsem/gocronlock

go 1.22.0

replace github.com/redsem/redsem => ../

require (
	github.com/alicebob/miniredis/v2 v2.40.0
	github.com/go-co-op/gocron/v2 v2.21.2
	github.com/gomodule/redigo v1.9.3
	github.com/google/uuid v1.6.0
	github.com/redsem/redsem v0.0.0-00010101000000-000000000000
	github.com/stretchr/testify v1.12.1
	go.uber.org/goleak v1.3.0
)

require (
	github.com/jonboulle/clockwork v0.5.0 // indirect
	github.com/robfig/cron/v3 v3.0.1 // indirect
	github.com/yuin/gopher-lua v1.1.1 // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
)
