package lambdaenv_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/pkg/inbox"
	"github.com/sluicehq/sluice/pkg/lambdaenv"
)

func TestConsumerClaimCheck(t *testing.T) {
	t.Setenv("AWS_REGION", "us-east-1")
	env := func(kv map[string]string) lambdaenv.Getenv { return func(k string) string { return kv[k] } }
	cc, err := lambdaenv.ConsumerClaimCheck(context.Background(), env(nil))
	require.NoError(t, err)
	require.Nil(t, cc, "off without SLUICE_CLAIM_CHECK_BUCKET")

	cc, err = lambdaenv.ConsumerClaimCheck(context.Background(), env(map[string]string{lambdaenv.ClaimCheckBucket: "payloads", lambdaenv.ClaimCheckMaxPayload: "1048576"}))
	require.NoError(t, err)
	require.NotNil(t, cc.Store)
	require.Equal(t, 1<<20, cc.MaxPayloadBytes)

	for _, bad := range []string{"-1", "x", "999999999999"} {
		err := lambdaenv.CheckConsumerClaimCheck(env(map[string]string{lambdaenv.ClaimCheckBucket: "payloads", lambdaenv.ClaimCheckMaxPayload: bad}))
		require.ErrorContains(t, err, lambdaenv.ClaimCheckMaxPayload)
	}
	require.NoError(t, lambdaenv.CheckConsumerClaimCheck(env(map[string]string{lambdaenv.ClaimCheckBucket: "payloads"})))
	err = lambdaenv.CheckConsumerClaimCheck(env(map[string]string{lambdaenv.ClaimCheckBucket: "payloads", lambdaenv.ClaimCheckMaxPayload: "268435457"}))
	require.ErrorContains(t, err, "at most")
	require.Positive(t, inbox.DefaultMaxPayloadBytes, "unset, the inbox's default applies")
}
