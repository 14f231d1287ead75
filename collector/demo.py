"""The embedded demo tenant used by `collector serve --demo` and the README's first command.

The keys are public on purpose: they exist for local trials only.
"""

DEMO_BROWSER_KEY = "cs_test_demo0000000000"
DEMO_MOBILE_KEY = "cs_mob_live_demo0000000000"
DEMO_SERVER_KEY = "cs_srv_live_demo0000000000"
DEMO_KEYS = (DEMO_BROWSER_KEY, DEMO_MOBILE_KEY, DEMO_SERVER_KEY)

DEMO_TENANTS = b"""{
  "keys": [
    {"key": "cs_test_demo0000000000", "clientId": "demo", "name": "Demo", "plan": "paid",
     "rateLimit": 5000, "createdAt": "2026-11-01T00:00:00Z", "keyType": "browser",
     "sites": [{"siteId": "demo-web", "name": "Demo web", "domains": ["localhost", "example.com"]}]},
    {"key": "cs_mob_live_demo0000000000", "clientId": "demo", "name": "Demo", "plan": "paid",
     "rateLimit": 2500, "createdAt": "2026-11-01T00:00:00Z", "keyType": "mobile",
     "sites": [{"siteId": "demo-app", "name": "Demo app"}]},
    {"key": "cs_srv_live_demo0000000000", "clientId": "demo", "name": "Demo", "plan": "paid",
     "rateLimit": 2500, "createdAt": "2026-11-01T00:00:00Z", "keyType": "server",
     "sites": [{"siteId": "demo-server", "name": "Demo backend"}]}
  ]
}"""
