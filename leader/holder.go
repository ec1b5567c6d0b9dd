package leader

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// Holder reads who holds the lease now: the instance's name and its term's
// epoch; held is false when no one does. A value no Hearth writes (the lease
// is Hearth's own key, so anyone could) is reported as held by "" at epoch 0
// with an error saying what was wrong; it is never trusted further.
func (l *Lease) Holder(ctx context.Context) (instance string, epoch int64, held bool, err error) {
	v, err := l.opts.Client.Get(ctx, l.leaseKey).Result()
	if errors.Is(err, redis.Nil) {
		return "", 0, false, nil
	}
	if err != nil {
		return "", 0, false, fmt.Errorf("read lease %s: %w", l.leaseKey, err)
	}
	// <epoch>:<instance>/<attempt>, as tryAcquire writes it.
	e, token, ok := strings.Cut(v, ":")
	slash := strings.LastIndexByte(token, '/')
	n, perr := strconv.ParseInt(e, 10, 64)
	if !ok || slash <= 0 || perr != nil || n <= 0 {
		return "", 0, true, fmt.Errorf("read lease %s: not a Hearth lease value: %.64q", l.leaseKey, v)
	}
	return token[:slash], n, true, nil
}
