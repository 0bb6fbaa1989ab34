-- cowproxy copy-on-write layer, version 40: admin routes shared by every proxy process and replica.
-- `cowproxy serve --state-dsn DSN` keeps the routes of `cowproxy session route` here (keyed by the routed
-- database's name, which may be any database behind the proxy) and hears of changes on the notification
-- channel cow_proxy_routes, so N workers, or N replicas behind one TCP load balancer, obey a route made
-- through any of them. Only the proxy's own role (the layer's owner, or one granted these rights) uses it.
CREATE TABLE IF NOT EXISTS cow.proxy_routes (
    database text PRIMARY KEY,
    session text NOT NULL CHECK (session ~ '^[A-Za-z0-9._:-]{1,128}$'),
    made_at timestamptz NOT NULL DEFAULT now()
);
REVOKE ALL ON cow.proxy_routes FROM PUBLIC;
