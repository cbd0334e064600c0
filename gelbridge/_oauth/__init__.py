"""atproto OAuth (issue 26), the pure core: ES256 keys and JWS (:mod:`.jose`), DPoP proofs
and per-server nonces (:mod:`.dpop`), and the least scope gelbridge asks for
(:mod:`.scopes`). No I/O here: the token requests and the PDS calls that use these live in
the shell. The facts behind each rule are in docs/research/oauth.md."""
