"""Kafka security: the ACLs an app needs and the failures a secured cluster answers with.

`acls` (the one ACL model: what each part of an app needs, the least-privilege table and
`kafka-acls` commands), `authorization` (a refused ACL as a clear error), `failures`
(authentication and TLS failures seen by a client, told apart and explained) and `tls_probe`
(why a broker's certificate is not trusted).
"""
