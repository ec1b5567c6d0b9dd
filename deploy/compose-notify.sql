-- Generated: hearth notify-sql product --table products -c deploy/config.compose.yaml
-- (TestComposeFile checks that it matches). Applied by docker-compose.yml's notify-triggers service.
-- Change notifications of "products" for declaration "product" (channel 'hearth_products', member column "id").
BEGIN;
DROP TRIGGER IF EXISTS "hearth_product_ins" ON "products";
CREATE TRIGGER "hearth_product_ins" AFTER INSERT ON "products" REFERENCING NEW TABLE AS hearth_new
  FOR EACH STATEMENT EXECUTE FUNCTION hearth_notify('hearth_products', 'id');
DROP TRIGGER IF EXISTS "hearth_product_upd" ON "products";
CREATE TRIGGER "hearth_product_upd" AFTER UPDATE ON "products" REFERENCING OLD TABLE AS hearth_old NEW TABLE AS hearth_new
  FOR EACH STATEMENT EXECUTE FUNCTION hearth_notify('hearth_products', 'id');
DROP TRIGGER IF EXISTS "hearth_product_del" ON "products";
CREATE TRIGGER "hearth_product_del" AFTER DELETE ON "products" REFERENCING OLD TABLE AS hearth_old
  FOR EACH STATEMENT EXECUTE FUNCTION hearth_notify('hearth_products', 'id');
COMMIT;
