"""Group commits: many callers' work shares one transaction. ``engine`` is the engine
(lanes, groups, withdrawal, splitting a failed group); its two uses are ``transitions``
(the Start / renew / Finish / release batches of many Worker connections, one lane per
application) and ``submits`` (concurrent single ``POST /v1/tasks``, one lane per
namespace). Above the repositories they run, below the services that build them."""
