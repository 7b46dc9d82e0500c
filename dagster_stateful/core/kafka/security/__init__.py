"""Kafka security: the ACLs an app needs and the failures a secured cluster answers with.

`acl_model` (the one ACL model: resource types, pattern types, operations, `AclRequirement`),
`acls` (the least-privilege table an app needs, as `kafka-acls` commands, bindings or a table),
`authorization` (what each part of a worker needs, and a refused ACL as a clear error), `failures`
(authentication and TLS failures seen by a client, told apart and explained) and `tls_probe`
(why a broker's certificate is not trusted).
"""
